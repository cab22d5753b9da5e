// Command gpuslice-fake-cri is the container runtime of the local test cluster's simulated nodes: the
// CRI fake of k8s.io/cri-client (nothing runs) that also appends every CreateContainer request to a
// JSON-lines file. It only wires flags and signals; the behaviour lives in package fakecri.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gpuslice/gpuslice/test/fakecri"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// run returns 0 after SIGTERM or SIGINT, 1 when serving fails, 2 for bad flags.
func run(args []string) int {
	const name = "gpuslice-fake-cri"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	socket := fs.String("socket", "", "unix socket path to serve CRI on (required)")
	records := fs.String("record-file", "", "file to append one JSON line per CreateContainer to (required)")
	cdiDirs := fs.String("cdi-spec-dirs", "", "comma-separated folders to resolve CDI devices from at CreateContainer (empty: record CDI device names only)")
	cdiRefresh := fs.String("cdi-refresh", "create", "when the CDI spec folders are read: create (at every CreateContainer) or notify (when inotify reports a change, as containerd 2.x does)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *socket == "" || *records == "" {
		fmt.Fprintf(os.Stderr, "%s: --socket and --record-file are required\n", name)
		return 2
	}
	if *cdiRefresh != "create" && *cdiRefresh != "notify" {
		fmt.Fprintf(os.Stderr, "%s: --cdi-refresh=%q: want create or notify\n", name, *cdiRefresh)
		return 2
	}
	opts := fakecri.Options{CDIOnNotify: *cdiRefresh == "notify"}
	if *cdiDirs != "" {
		opts.CDISpecDirs = strings.Split(*cdiDirs, ",")
	}
	srv, err := fakecri.New(*records, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		srv.Stop()
	}()
	fmt.Fprintf(os.Stderr, "%s: serving CRI on %s, recording to %s\n", name, *socket, *records)
	if err := srv.Serve(*socket); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gpuslice/gpuslice/test/cluster"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run returns the exit code: 0 on success, 1 when the command fails, 2 for bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	const name = "gpuslice-demo"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", filepath.Join(os.TempDir(), "gpuslice-demo"), "the cluster's folder (short: unix socket paths live under it)")
	binDir := fs.String("bin-dir", "", "folder of the hack/build-cluster.sh binaries (default: _output/cluster/bin above the working directory)")
	cliDir := fs.String("cli-dir", "", "folder with kubectl-gpuslice (make build's _output/bin); when set, up ends by printing kubectl gpuslice status")
	dra := fs.Bool("dra", false, "up: add a third node in DRA mode (gpuslice-dra-plugin, gpuslice.hami.io/mode=dra) and two hami.io pods the webhook turns into claims there")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s [flags] up|down\n", name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	statePath := filepath.Join(*dir, "state.json")
	var err error
	switch fs.Arg(0) {
	case "up":
		if os.Geteuid() != 0 {
			err = errors.New("needs root: each kubelet bind-mounts /var/lib and /var/log in its own mount namespace (try sudo)")
			break
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		err = up(ctx, stdout, *dir, *binDir, *cliDir, *dra)
	case "down":
		began := time.Now()
		if err = cluster.Down(statePath); err == nil {
			fmt.Fprintf(stdout, "demo cluster stopped and %s removed in %v\n", *dir, time.Since(began).Round(time.Millisecond))
		}
	default:
		fs.Usage()
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

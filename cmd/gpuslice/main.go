// Command gpuslice is the operator's tool for gpuslice, installed also as
// kubectl-gpuslice, so that kubectl runs it as "kubectl gpuslice".
// Subcommands:
//
//	gpuslice status [--node NODE] [-o wide|json|yaml] [--watch]
//	gpuslice doctor [NODE...] [-o json]
//	gpuslice why POD [-n NAMESPACE] [-o json|yaml]
//	gpuslice simulate --trace PODS.csv --nodes NODES.csv [--policy all] [--seeds 10]
//
// status, doctor and why read the API server only, with kubectl's
// kubeconfig flags (docs/cli.md). simulate replays a GPU cluster trace
// through the scheduler's own Fit and Score and prints the packing quality
// of each policy (docs/scheduling.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/spf13/pflag"
)

// version is set at build time (-ldflags -X main.version=...).
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := runWith(ctx, os.Args[1:], os.Stdout, kubeconfigClient)
	stop()
	switch {
	case errors.Is(err, errChecksFailed):
		os.Exit(1)
	case err != nil:
		fmt.Fprintln(os.Stderr, "gpuslice:", err)
		os.Exit(2)
	}
}

const usage = `usage: gpuslice <command> [flags]   (also: kubectl gpuslice <command>)

commands:
  status     nodes × GPUs: model, memory used/total, cores, slices and the pods on each GPU
  doctor     check the device plugin's registration on each GPU node, the webhook and the scheduler
  why        say why a pending GPU pod fits no node, node by node, and which node comes closest
  simulate   replay a GPU cluster trace through Fit and Score and report packing quality

status, doctor and why take kubectl's --kubeconfig, --context and -n/--namespace.
Exit codes: 0 ok, 1 doctor found a FAIL, 2 an error.`

// run is runWith with the kubeconfig's API server.
func run(ctx context.Context, args []string, out io.Writer) error {
	return runWith(ctx, args, out, kubeconfigClient)
}

// runWith dispatches args (without the program name) to a subcommand that
// writes its report to out; conn reaches the API server.
func runWith(ctx context.Context, args []string, out io.Writer, conn connect) error {
	err := dispatch(ctx, args, out, conn)
	if errors.Is(err, pflag.ErrHelp) {
		return nil // the flag set printed the usage
	}
	return err
}

func dispatch(ctx context.Context, args []string, out io.Writer, conn connect) error {
	if len(args) == 0 {
		return fmt.Errorf("no command given\n%s", usage)
	}
	switch args[0] {
	case "status":
		return runStatus(ctx, args[1:], out, conn)
	case "doctor":
		return runDoctor(ctx, args[1:], out, conn)
	case "why":
		return runWhy(ctx, args[1:], out, conn)
	case "simulate":
		return runSimulate(ctx, args[1:], out)
	case "help", "-h", "--help":
		_, err := fmt.Fprintln(out, usage)
		return err
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// Command gpuslice is the operator's tool for gpuslice. Subcommands:
//
//	gpuslice simulate --trace PODS.csv --nodes NODES.csv [--policy all] [--seeds 10]
//
// simulate replays a GPU cluster trace through the scheduler's own Fit and
// Score and prints the packing quality of each policy (docs/scheduling.md).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuslice:", err)
		os.Exit(2)
	}
}

const usage = `usage: gpuslice <command> [flags]

commands:
  simulate   replay a GPU cluster trace through Fit and Score and report packing quality`

// run dispatches args (without the program name) to a subcommand that
// writes its report to out.
func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("no command given\n%s", usage)
	}
	switch args[0] {
	case "simulate":
		return runSimulate(ctx, args[1:], out)
	case "help", "-h", "--help":
		_, err := fmt.Fprintln(out, usage)
		return err
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

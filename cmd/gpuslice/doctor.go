package main

import (
	"context"
	"errors"
	"io"

	"github.com/gpuslice/gpuslice/internal/inspect"
)

// errChecksFailed is doctor's error when a check failed: exit code 1.
var errChecksFailed = errors.New("doctor: some checks failed")

// runDoctor prints the registration checklist of the named nodes (or
// every GPU node) and the cluster's checks.
func runDoctor(ctx context.Context, args []string, out io.Writer, conn connect) error {
	cmd := newCommand("doctor", "output format: json (default a checklist)", out)
	format, err := cmd.parse(args, inspect.FormatJSON)
	if err != nil {
		return err
	}
	k := cmd.kube
	client, ns, err := conn(k)
	if err != nil {
		return err
	}
	snap, err := inspect.Load(ctx, client, inspect.LoadOptions{HeartbeatNamespace: k.heartbeatNamespace, Doctor: true, DryRunNamespace: ns})
	if err != nil {
		return err
	}
	report, err := inspect.Doctor(snap, cmd.fs.Args())
	if err != nil {
		return err
	}
	if format == inspect.FormatJSON {
		err = inspect.Encode(out, format, report)
	} else {
		err = inspect.RenderDoctor(out, report, styleFor(out))
	}
	if err != nil {
		return err
	}
	if report.Failures > 0 {
		return errChecksFailed
	}
	return nil
}

package main

import (
	"context"
	"fmt"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/inspect"
)

// runWhy explains, for one pod, every node's verdict.
func runWhy(ctx context.Context, args []string, out io.Writer, conn connect) error {
	cmd := newCommand("why", "output format: json or yaml (default a table)", out)
	format, err := cmd.parse(args, inspect.FormatJSON, inspect.FormatYAML)
	if err != nil {
		return err
	}
	fs, k := cmd.fs, cmd.kube
	if fs.NArg() != 1 {
		return fmt.Errorf("why takes one pod name, got %d arguments (usage: gpuslice why POD [-n NAMESPACE])", fs.NArg())
	}
	client, ns, err := conn(k)
	if err != nil {
		return err
	}
	pod, err := client.CoreV1().Pods(ns).Get(ctx, fs.Arg(0), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", ns, fs.Arg(0), err)
	}
	snap, err := inspect.Load(ctx, client, inspect.LoadOptions{HeartbeatNamespace: k.heartbeatNamespace, SchedulerConfig: true})
	if err != nil {
		return err
	}
	r := inspect.Why(snap, pod)
	if format != inspect.FormatTable {
		return inspect.Encode(out, format, r)
	}
	return inspect.RenderWhy(out, r)
}

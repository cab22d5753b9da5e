package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/internal/inspect"
)

// runStatus prints the GPU nodes' use: once, or on every change with
// --watch until ctx ends.
func runStatus(ctx context.Context, args []string, out io.Writer, conn connect) error {
	cmd := newCommand("status", "output format: wide, json or yaml (default a table)", out)
	fs, k := cmd.fs, &cmd.kube
	node := fs.String("node", "", "show only this node")
	watch := fs.BoolP("watch", "w", false, "redraw whenever something changes, until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "with --watch, how often to read the API server")
	format, err := cmd.parse(args, inspect.FormatWide, inspect.FormatJSON, inspect.FormatYAML)
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("status takes no arguments, got %q (use --node NAME)", fs.Args())
	}
	if *interval <= 0 {
		return fmt.Errorf("--interval=%s: must be above 0", *interval)
	}
	client, _, err := conn(*k)
	if err != nil {
		return err
	}
	st := styleFor(out)
	if !*watch {
		return printStatus(ctx, out, client, *k, *node, format, st)
	}
	var last []byte
	for {
		var buf bytes.Buffer
		if err := printStatus(ctx, &buf, client, *k, *node, format, st); err != nil {
			return err
		}
		if !bytes.Equal(buf.Bytes(), last) {
			if st.Colour {
				fmt.Fprint(out, "\x1b[H\x1b[2J") // home, clear: redraw in place
			} else if last != nil {
				fmt.Fprintln(out)
			}
			if _, err := out.Write(buf.Bytes()); err != nil {
				return err
			}
			last = buf.Bytes()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

func printStatus(ctx context.Context, out io.Writer, client kubernetes.Interface, k kubeFlags, node string, f inspect.Format, st inspect.Style) error {
	snap, err := inspect.Load(ctx, client, inspect.LoadOptions{HeartbeatNamespace: k.heartbeatNamespace})
	if err != nil {
		return err
	}
	nodes, err := inspect.Status(snap, node)
	if err != nil {
		return err
	}
	if f == inspect.FormatJSON || f == inspect.FormatYAML {
		return inspect.Encode(out, f, map[string]any{"nodes": nodes})
	}
	return inspect.RenderStatus(out, nodes, f, st)
}

package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// simulateTestdata runs `gpuslice simulate` on vgpu/simulate's small trace with its published
// figures and extra flags, and returns what it printed.
func simulateTestdata(t *testing.T, extra ...string) string {
	t.Helper()
	dir := filepath.Join("..", "..", "vgpu", "simulate", "testdata")
	var out bytes.Buffer
	args := append([]string{"simulate",
		"--trace", filepath.Join(dir, "pods.csv"), "--nodes", filepath.Join(dir, "nodes.csv"),
		"--expected", filepath.Join(dir, "published.csv"),
	}, extra...)
	if err := run(context.Background(), args, &out); err != nil {
		t.Fatalf("run() error = %v\n%s", err, out.String())
	}
	return out.String()
}

func TestSimulate(t *testing.T) {
	t.Parallel()
	out := simulateTestdata(t, "--seeds", "2")
	for _, want := range []string{
		"trace pods.csv: 40 tasks; nodes nodes.csv: 5 nodes, 23 GPUs; seeds 42..43",
		"fragmentation", "binpack", "spread", "random", "fgd",
		"FGD              4.77%",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestSimulateVariant(t *testing.T) {
	t.Parallel()
	out := simulateTestdata(t, "--seeds", "1", "--policy", "fgd,fragmentation", "--variant", "multigpu40")
	if want := "trace pods.csv as multigpu40: "; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
}

func TestSimulateFailed(t *testing.T) {
	t.Parallel()
	out := simulateTestdata(t, "--seeds", "2", "--policy", "binpack", "--failed", "3")
	for _, want := range []string{
		"failed tasks of binpack with the most GPU demand (mean per seed):",
		"4                 1000              any    0.5        2.00",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		args []string
		want string
	}{
		"no command":      {nil, "no command given"},
		"unknown command": {[]string{"bake"}, `unknown command "bake"`},
		"missing flags":   {[]string{"simulate"}, "--trace: required\n--nodes: required"},
		"bad policy": {[]string{"simulate", "--trace", "a", "--nodes", "b", "--policy", "tetris"},
			`--policy="tetris": must be all or a comma-separated list of random, spread, binpack, fgd, fragmentation`},
		"bad variant": {[]string{"simulate", "--trace", "a", "--nodes", "b", "--variant", "gpuspec"},
			`--variant: bad variant: "gpuspec"`},
		"missing file": {[]string{"simulate", "--trace", "a", "--nodes", "nope.csv"}, "open nope.csv"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			err := run(context.Background(), tt.args, &out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) error = %v, want it to contain %q", tt.args, err, tt.want)
			}
		})
	}
}

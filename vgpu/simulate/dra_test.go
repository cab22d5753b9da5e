package simulate_test

import (
	"reflect"
	"testing"

	"github.com/gpuslice/gpuslice/vgpu/simulate"
)

// TestReplayDRA checks the DRA-mode replay on hand-made cases: first-fit devices inside a node
// (a half GPU then a whole one need two GPUs, where best fit would too), node choice by
// least-allocated CPU and memory, model filters, and determinism on the test trace.
func TestReplayDRA(t *testing.T) {
	t.Parallel()
	two := []simulate.Node{{Name: "a", CPUMilli: 8000, MemoryMiB: 65536, GPUs: 2, Model: "T4"}}
	tests := []struct {
		name       string
		nodes      []simulate.Node
		tasks      []simulate.Task
		wantPlaced int
	}{{
		name:  "first fit: half, half, whole fill two GPUs",
		nodes: two,
		tasks: []simulate.Task{
			{Name: "h1", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, GPUMilli: 500},
			{Name: "h2", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, GPUMilli: 500},
			{Name: "w", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, GPUMilli: 1000},
		},
		wantPlaced: 3,
	}, {
		name:  "a model no node has",
		nodes: two,
		tasks: []simulate.Task{{Name: "v", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, GPUMilli: 1000, Models: []string{"V100M32"}}, {Name: "w", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 2, GPUMilli: 1000}},
		// The V100 task fails; the whole-node task brings the demand to the capacity.
		wantPlaced: 1,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := simulate.Replay(tt.nodes, tt.tasks, simulate.Config{Policy: simulate.PolicyDRA, Seed: 1, Tune: 1})
			if err != nil {
				t.Fatal(err)
			}
			if res.Placed != tt.wantPlaced {
				t.Errorf("placed %d of %d arrived (%+v), want %d", res.Placed, res.Arrived, res, tt.wantPlaced)
			}
		})
	}

	nodes, tasks := readTestdata(t)
	a, err := simulate.Replay(nodes, tasks, simulate.Config{Policy: simulate.PolicyDRA, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	b, err := simulate.Replay(nodes, tasks, simulate.Config{Policy: simulate.PolicyDRA, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("two replays of seed 42 differ: %+v and %+v", a, b)
	}
	if a.Placed == 0 || a.UnallocatedPercent < 0 || a.UnallocatedPercent > 100 {
		t.Errorf("test trace: %+v; want tasks placed and unallocated within 0-100%%", a)
	}
}

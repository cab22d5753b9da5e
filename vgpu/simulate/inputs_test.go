package simulate_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/simulate"
)

func TestArrivalsAreReplayOrder(t *testing.T) {
	t.Parallel()
	nodes, tasks := readTestdata(t)
	var capacity int64
	for _, n := range nodes {
		capacity += int64(n.GPUs) * 1000
	}
	tests := map[string]simulate.Config{
		"seed 42":           {Seed: 42},
		"seed 7, tune 1.5":  {Seed: 7, Tune: 1.5},
		"fragmentation, 43": {Seed: 43, Policy: simulate.PolicyFragmentation},
	}
	for name, cfg := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := simulate.Arrivals(nodes, tasks, cfg)
			if err != nil {
				t.Fatal(err)
			}
			res, err := simulate.Replay(nodes, tasks, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != res.Arrived {
				t.Errorf("Arrivals returned %d tasks, Replay placed %d", len(got), res.Arrived)
			}
			var demand int64
			for i, task := range got {
				if demand >= capacity {
					t.Fatalf("task %d arrives after the demand reached the capacity %d", i, capacity)
				}
				demand += task.DemandMilli()
			}
			if demand < capacity {
				t.Errorf("arrived demand %d, want at least the capacity %d", demand, capacity)
			}
			again, err := simulate.Arrivals(nodes, tasks, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("Arrivals is not deterministic (-first +second):\n%s", diff)
			}
		})
	}
	if _, err := simulate.Arrivals(nil, tasks, simulate.Config{}); err == nil {
		t.Error("Arrivals without nodes: no error, want ErrNoCapacity")
	}
}

func TestNodeInventoryAndPodDemand(t *testing.T) {
	t.Parallel()
	nodes, tasks := readTestdata(t)
	inv := simulate.NodeInventory(nodes[2], 0)
	if err := inv.Validate(); err != nil {
		t.Fatalf("NodeInventory: %v", err)
	}
	want := vgpu.NodeInventory{Node: "tiny-node-2", SplitCount: simulate.DefaultSplitCount, MemoryScaling: 1, GPUs: []vgpu.GPU{
		{UUID: "tiny-node-2-gpu0", Index: 0, Minor: 0, Model: "T4", TotalMemoryMiB: 16384, SchedulableMemoryMiB: 16384, CoresPercent: 100, NUMANode: -1, Health: vgpu.Healthy},
		{UUID: "tiny-node-2-gpu1", Index: 1, Minor: 1, Model: "T4", TotalMemoryMiB: 16384, SchedulableMemoryMiB: 16384, CoresPercent: 100, NUMANode: -1, Health: vgpu.Healthy},
	}}
	if diff := cmp.Diff(want, inv); diff != "" {
		t.Errorf("NodeInventory mismatch (-want +got):\n%s", diff)
	}
	// tiny-pod-0001: one whole GPU of a V100 model.
	wantDemand := vgpu.PodDemand{
		Request:     vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "main", GPUs: 1, MemoryPercent: 100, CoresPercent: 100, Exclusive: true}}},
		Constraints: vgpu.Constraints{Models: []string{"V100M16", "V100M32"}},
		Host:        vgpu.HostResources{CPUMilli: 4000, MemoryMiB: 16384},
	}
	if diff := cmp.Diff(wantDemand, simulate.PodDemand(tasks[1])); diff != "" {
		t.Errorf("PodDemand mismatch (-want +got):\n%s", diff)
	}
}

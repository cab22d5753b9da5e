package vgpu_test

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestFragmentation(t *testing.T) {
	t.Parallel()
	node := vgputest.Node("n1").GPU("GPU-0", 10000).GPU("GPU-1", 10000).Obj()
	w := vgpu.NewWorkload(
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 50, Weight: 1},
		vgpu.WorkloadClass{GPUs: 2, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Weight: 1},
	)
	tests := []struct {
		name  string
		usage *vgpu.NodeUsage
		host  *vgpu.HostResources
		want  float64
	}{{
		name: "empty node is not fragmented",
		want: 0,
	}, {
		// GPU-0 has 0.3 free: useless to both classes. GPU-1 is whole but
		// alone: useless to the 2-GPU class.
		name:  "a small leftover and a lone whole GPU",
		usage: vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 7000, 0).Obj()),
		want:  0.5*0.3 + 0.5*1.3,
	}, {
		name: "a known host fits classes without host requests",
		host: &vgpu.HostResources{},
		want: 0,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := vgpu.Fragmentation(vgpu.NodeState{Inventory: node, Usage: tt.usage, HostFree: tt.host}, w)
			if math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Fragmentation() = %v, want %v", got, tt.want)
			}
		})
	}
	hungry := vgpu.NewWorkload(vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 10, Host: vgpu.HostResources{CPUMilli: 4000}, Weight: 1})
	if got := vgpu.Fragmentation(vgpu.NodeState{Inventory: node, HostFree: &vgpu.HostResources{CPUMilli: 1000}}, hungry); got != 2 {
		t.Errorf("Fragmentation() with a host short of CPU = %v, want 2", got)
	}
	// A class of pods without GPUs weighs its pods as the others do, and,
	// not fitting the host, finds both free GPUs fragmented; the GPU
	// class fits two pods and can use both.
	cpuOnly := vgpu.NewWorkload(
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 50, Host: vgpu.HostResources{CPUMilli: 4000}, Weight: 1},
		vgpu.WorkloadClass{Host: vgpu.HostResources{CPUMilli: 16000}, Weight: 1},
	)
	if got := vgpu.Fragmentation(vgpu.NodeState{Inventory: node, HostFree: &vgpu.HostResources{CPUMilli: 10000}}, cpuOnly); math.Abs(got-0.5*2) > 1e-9 {
		t.Errorf("Fragmentation() with CPU-only pods short of CPU = %v, want %v", got, 0.5*2)
	}
	// The workload asks 4000m per GPU. 6000m free feeds three light pods
	// but one heavy one, or 1.5 GPUs at the workload's CPU per GPU: the
	// heavy class can use 1.5 of the 2 free GPUs, the light one both.
	bounded := vgpu.NewWorkload(
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Host: vgpu.HostResources{CPUMilli: 2000}, Weight: 1},
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Host: vgpu.HostResources{CPUMilli: 6000}, Weight: 1},
	)
	if got := vgpu.Fragmentation(vgpu.NodeState{Inventory: node, HostFree: &vgpu.HostResources{CPUMilli: 6000}}, bounded); math.Abs(got-0.5*0.5) > 1e-9 {
		t.Errorf("Fragmentation() with CPU for 1.5 GPUs = %v, want %v", got, 0.5*0.5)
	}
	// Memory bounds as CPU does: the workload asks 8 GiB per GPU, so 12
	// GiB free feeds 1.5 GPUs however much CPU is free; the heavy class
	// fits one pod of its own and can use 1.5 of the 2 free GPUs.
	memoryBound := vgpu.NewWorkload(
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Host: vgpu.HostResources{CPUMilli: 2000, MemoryMiB: 4096}, Weight: 1},
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Host: vgpu.HostResources{CPUMilli: 6000, MemoryMiB: 12288}, Weight: 1},
	)
	if got := vgpu.Fragmentation(vgpu.NodeState{Inventory: node, HostFree: &vgpu.HostResources{CPUMilli: 16000, MemoryMiB: 12288}}, memoryBound); math.Abs(got-0.5*0.5) > 1e-9 {
		t.Errorf("Fragmentation() with memory for 1.5 GPUs = %v, want %v", got, 0.5*0.5)
	}
	// The paper's rule: one pod fits, so every free GPU is usable; a
	// snapshot keeps the rule.
	bounded.SetHostFitOnly(true)
	if got := vgpu.Fragmentation(vgpu.NodeState{Inventory: node, HostFree: &vgpu.HostResources{CPUMilli: 6000}}, bounded.Snapshot(0)); got != 0 {
		t.Errorf("Fragmentation() under SetHostFitOnly = %v, want 0", got)
	}
	if got := vgpu.Fragmentation(vgpu.NodeState{Inventory: node}, nil); got != 0 {
		t.Errorf("Fragmentation() with no workload = %v, want 0", got)
	}
}

func TestWorkloadAdd(t *testing.T) {
	t.Parallel()
	var w vgpu.Workload
	host := vgpu.HostResources{CPUMilli: 4000, MemoryMiB: 8192}
	share := vgputest.Pod("p").MemoryPercent(25).Cores(40).PodRequest()
	w.Add(vgpu.PodDemand{Request: share, Host: host})
	w.Add(vgpu.PodDemand{Request: share, Host: host})
	w.Add(vgpu.PodDemand{Request: vgputest.Pod("p").GPU(2).PodRequest()})
	w.Add(vgpu.PodDemand{Request: vgputest.Pod("p").InitContainer("i").MemoryMiB(512).Container("c").MemoryMiB(1024).PodRequest()})
	w.Add(vgpu.PodDemand{Host: host}) // no GPU: no class
	want := []vgpu.WorkloadClass{
		{GPUs: 1, MemoryPercent: 25, CoresPercent: 40, Host: host, Weight: 2},
		{GPUs: 2, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Weight: 1},
		{GPUs: 1, MemoryMiB: 1024, Weight: 1},
	}
	if diff := cmp.Diff(want, w.Classes(), cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); diff != "" {
		t.Errorf("Classes() mismatch (-want +got):\n%s", diff)
	}
	// 8000m over a GPU demand of 2 × 0.4 (the shares) + 2 (the whole
	// GPUs) + 0.1 (the request in MiB).
	if got, want := w.CPUPerGPU(), 8000/2.9; math.Abs(got-want) > 1e-9 {
		t.Errorf("CPUPerGPU() = %v, want %v", got, want)
	}
}

func TestWorkloadSupply(t *testing.T) {
	t.Parallel()
	// One T4 and one A100 node, each with one GPU of which 0.6 is used.
	// The pinned class accepts T4 only; the cluster has 1 T4 of 4 GPUs.
	pinned := vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 50, Models: []string{"T4"}, Weight: 1}
	any := vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 30, Weight: 1}
	t4 := vgputest.Node("t4").GPU("GPU-0", 10000).Model("GPU-0", "Tesla T4").Obj()
	a100 := vgputest.Node("a100").GPU("GPU-1", 10000).Model("GPU-1", "A100").Obj()
	tests := []struct {
		name   string
		supply map[string]int
		node   vgpu.NodeInventory
		uuid   string
		want   float64
	}{
		// 0.4 free: the pinned class cannot use it (model or size), the
		// other can.
		{"no supply, T4", nil, t4, "GPU-0", 0.5 * 0.4},
		{"no supply, A100", nil, a100, "GPU-1", 0.5 * 0.4},
		// The pinned class weighs 4 per GPU it can use against 1.
		{"supply, T4", map[string]int{"Tesla T4": 1, "A100": 3}, t4, "GPU-0", 0.8 * 0.4},
		{"supply, A100", map[string]int{"Tesla T4": 1, "A100": 3}, a100, "GPU-1", 0.8 * 0.4},
		{"supply without the pinned model", map[string]int{"A100": 3}, a100, "GPU-1", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := vgpu.NewWorkload(pinned, any)
			w.SetSupply(tt.supply)
			w.SetExpectedFill(false) // the supply's weights alone
			usage := vgputest.Usage(vgputest.Allocation(tt.node.Node).Slice(tt.uuid, 6000, 0).Obj())
			got := vgpu.Fragmentation(vgpu.NodeState{Inventory: tt.node, Usage: usage}, w)
			if math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Fragmentation() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestWorkloadHalfLife(t *testing.T) {
	t.Parallel()
	w := &vgpu.Workload{}
	w.SetHalfLife(2)
	whole := vgpu.PodDemand{Request: vgputest.Pod("p").GPU(1).PodRequest()}
	half := vgpu.PodDemand{Request: vgputest.Pod("p").MemoryPercent(50).PodRequest()}
	w.Add(whole)
	w.Add(whole)
	// Two pods later the whole-GPU pods weigh half as much as when added;
	// the shares are what counts, so compare them.
	w.Add(half)
	w.Add(half)
	got := w.Classes()
	ratio := got[0].Weight / got[1].Weight
	// whole: b1 + b2; half: b3 + b4, b growing by √2 a pod.
	r := math.Sqrt2
	want := (r + r*r) / (r*r*r + r*r*r*r)
	if math.Abs(ratio-want) > 1e-9 {
		t.Errorf("weight ratio whole/half = %v, want %v", ratio, want)
	}
	for range 5000 {
		w.Add(half)
	}
	if got := w.Classes(); got[0].Weight/got[1].Weight > 1e-100 || math.IsNaN(got[1].Weight) || math.IsInf(got[1].Weight, 0) {
		t.Errorf("after 5000 pods, weights %v and %v: want the old class forgotten and finite weights", got[0].Weight, got[1].Weight)
	}
}

func TestWorkloadSnapshot(t *testing.T) {
	t.Parallel()
	w := vgpu.NewWorkload(
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 10, Weight: 1},
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 50, Models: []string{"T4"}, Weight: 3},
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 20, Weight: 2},
		vgpu.WorkloadClass{GPUs: 2, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Weight: 2},
	)
	w.SetSupply(map[string]int{"Tesla T4": 1, "A100": 3})
	all := w.Snapshot(0)
	if diff := cmp.Diff(w.Classes(), all.Classes()); diff != "" {
		t.Errorf("Snapshot(0) classes mismatch (-want +got):\n%s", diff)
	}
	t4 := vgputest.Node("t4").GPU("GPU-0", 10000).Model("GPU-0", "Tesla T4").Obj()
	usage := vgputest.Usage(vgputest.Allocation("t4").Slice("GPU-0", 6000, 0).Obj())
	node := vgpu.NodeState{Inventory: t4, Usage: usage}
	if got, want := vgpu.Fragmentation(node, all), vgpu.Fragmentation(node, w); got != want {
		t.Errorf("Fragmentation() on Snapshot(0) = %v, want %v (supply kept)", got, want)
	}
	// The heaviest two, in the order first added; the tie at 2 goes to
	// the first added.
	top := w.Snapshot(2).Classes()
	want := []vgpu.WorkloadClass{w.Classes()[1], w.Classes()[2]}
	if diff := cmp.Diff(want, top); diff != "" {
		t.Errorf("Snapshot(2) classes mismatch (-want +got):\n%s", diff)
	}
	// Independent: adding to w changes no snapshot.
	w.Add(vgpu.PodDemand{Request: vgputest.Pod("p").MemoryPercent(10).PodRequest()})
	if got := all.Classes()[0].Weight; got != 1 {
		t.Errorf("snapshot weight after Add on the original = %v, want 1", got)
	}
	if got := w.Snapshot(0).Len(); got != 4 {
		t.Errorf("Len() = %d, want 4", got)
	}
}

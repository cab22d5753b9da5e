package vgpu_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestNodeUsagePhases(t *testing.T) {
	t.Parallel()
	pod := vgputest.Pod("p").
		InitContainer("init1").MemoryMiB(6000).Cores(50).
		Sidecar("proxy").MemoryMiB(1000).Cores(10).
		InitContainer("init2").MemoryMiB(3000).Cores(80).
		Container("main").MemoryMiB(4000).Cores(20)
	alloc := vgputest.Allocation("n1").
		InitContainer("init1").Slice("GPU-0", 6000, 50).
		InitContainer("proxy").Slice("GPU-0", 1000, 10).
		InitContainer("init2").Slice("GPU-0", 3000, 80).
		Container("main").Slice("GPU-0", 4000, 20).Slice("GPU-1", 4000, 20).Obj()
	tests := []struct {
		name string
		req  vgpu.PodRequest
		want map[string]vgpu.GPUUsage
	}{{
		// Phases on GPU-0: init1 alone (6000, 50, 1); proxy+init2 (4000,
		// 90, 2); proxy+main (5000, 30, 2). The max of each dimension.
		name: "with the request",
		req:  pod.PodRequest(),
		want: map[string]vgpu.GPUUsage{
			"GPU-0": {MemoryMiB: 6000, CoresPercent: 90, Slices: 2},
			"GPU-1": {MemoryMiB: 4000, CoresPercent: 20, Slices: 1},
		},
	}, {
		name: "without the request every init container counts as a sidecar",
		want: map[string]vgpu.GPUUsage{
			"GPU-0": {MemoryMiB: 14000, CoresPercent: 160, Slices: 4},
			"GPU-1": {MemoryMiB: 4000, CoresPercent: 20, Slices: 1},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var u vgpu.NodeUsage
			u.Add(alloc, tt.req)
			got := map[string]vgpu.GPUUsage{"GPU-0": u.GPU("GPU-0"), "GPU-1": u.GPU("GPU-1")}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("usage mismatch (-want +got):\n%s", diff)
			}
			u.Remove(alloc, tt.req)
			if g := u.GPU("GPU-0"); g != (vgpu.GPUUsage{}) {
				t.Errorf("after Remove GPU-0 holds %+v", g)
			}
		})
	}
}

func TestNodeUsageExclusive(t *testing.T) {
	t.Parallel()
	var u vgpu.NodeUsage
	u.Add(vgputest.Allocation("n1").Slice("GPU-0", 16384, 100).Obj(), vgputest.Pod("p").GPU(1).PodRequest())
	if diff := cmp.Diff(vgpu.GPUUsage{MemoryMiB: 16384, CoresPercent: 100, Slices: 1, Exclusive: 1}, u.GPU("GPU-0")); diff != "" {
		t.Errorf("usage mismatch (-want +got):\n%s", diff)
	}
	var nilUsage *vgpu.NodeUsage
	if g := nilUsage.GPU("GPU-0"); g != (vgpu.GPUUsage{}) {
		t.Errorf("nil usage holds %+v", g)
	}
}

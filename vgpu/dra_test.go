package vgpu_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestFitFirstFit checks PolicyFirstFit, the DRA allocator's order: the first GPUs in inventory
// order that fit, however full or empty they are, and ContainerRequest.UUIDs, a DRA request's
// selectors evaluated on the node.
func TestFitFirstFit(t *testing.T) {
	t.Parallel()
	node := vgputest.Node("n1").SplitCount(vgpu.DRASplitCount).
		GPU("GPU-0", 16384).GPU("GPU-1", 16384).GPU("GPU-2", 16384).GPU("GPU-3", 16384).Obj()
	// GPU-0 is nearly full, GPU-1 half used, GPU-2 and GPU-3 untouched.
	usage := vgputest.Usage(
		vgputest.Allocation("n1").Container("a").Slice("GPU-0", 14336, 0).Obj(),
		vgputest.Allocation("n1").Container("b").Slice("GPU-1", 8192, 50).Obj(),
	)
	slice := func(gpus int, mib int64, uuids ...string) vgpu.PodDemand {
		return vgpu.PodDemand{Request: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "main", GPUs: gpus, MemoryMiB: mib, UUIDs: uuids}}}}
	}
	tests := []struct {
		name   string
		pod    vgpu.PodDemand
		policy vgpu.Policy
		want   []string
	}{
		{"small slice: the first GPU, which binpack picks too", slice(1, 1024), vgpu.PolicyFirstFit, []string{"GPU-0"}},
		{"a slice GPU-0 cannot hold: GPU-1, the next", slice(1, 4096), vgpu.PolicyFirstFit, []string{"GPU-1"}},
		{"spread would take an untouched GPU", slice(1, 4096), vgpu.PolicySpread, []string{"GPU-2"}},
		{"two GPUs: the first two that fit", slice(2, 4096), vgpu.PolicyFirstFit, []string{"GPU-1", "GPU-2"}},
		{"UUIDs: only those, first in inventory order", slice(1, 1024, "GPU-3", "GPU-1"), vgpu.PolicyFirstFit, []string{"GPU-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opts := vgpu.FitOptions{NodePolicy: vgpu.PolicyFragmentation, GPUPolicy: tt.policy}
			state := vgpu.NodeState{Inventory: node, Usage: usage}
			p, err := vgpu.Fit(tt.pod, state, opts)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range p.Allocation.Containers[0].GPUs {
				got = append(got, s.UUID)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
			if p.GPUPolicy != tt.policy {
				t.Errorf("GPUPolicy %q, want %q", p.GPUPolicy, tt.policy)
			}
			// The summary's quick path gives the same.
			sp, err := vgpu.Summarize(state, nil).Fit(tt.pod, opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(p, sp); diff != "" {
				t.Errorf("NodeSummary.Fit differs (-Fit +summary):\n%s", diff)
			}
		})
	}

	// A request no listed GPU fits fails on the UUID filter.
	_, err := vgpu.Fit(slice(1, 4096, "GPU-0"), vgpu.NodeState{Inventory: node, Usage: usage}, vgpu.FitOptions{GPUPolicy: vgpu.PolicyFirstFit, ReasonOnly: true})
	if fe, ok := err.(*vgpu.FitError); !ok || fe.Reason != vgpu.ReasonInsufficientMemory { //nolint:errorlint // Fit returns *FitError unwrapped
		t.Errorf("UUIDs GPU-0 only, 4096 MiB: err %v, want %s", err, vgpu.ReasonInsufficientMemory)
	}
	if _, err := vgpu.ParsePolicy(string(vgpu.PolicyFirstFit)); err == nil {
		t.Errorf("ParsePolicy(%q) accepted: no pod or configuration may select it", vgpu.PolicyFirstFit)
	}
}

package extender

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestPrioritize checks the node order under binpack and spread: an empty
// node, a half-used one and one where the pod does not fit. A 2000 MiB
// slice of a 10000 MiB GPU leaves the empty node 20% used and the other
// 80%; scores are vgpu.Score's 0..100 scaled to 0..10.
func TestPrioritize(t *testing.T) {
	_, empty := gpuNode("empty", 1, 10000)
	_, used := gpuNode("used", 1, 10000)
	_, full := gpuNode("full", 1, 10000)
	pods := []runtime.Object{
		boundPod(vgputest.Pod("u").Container("main").GPU(1).MemoryMiB(6000),
			vgputest.Allocation("used").Container("main").Slice("used-GPU-0", 6000, 0).Obj()),
		boundPod(vgputest.Pod("f").Container("main").GPU(1).MemoryMiB(9000),
			vgputest.Allocation("full").Container("main").Slice("full-GPU-0", 9000, 0).Obj()),
	}
	pod := vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(2000).Obj()
	tests := []struct {
		policy vgpu.Policy
		want   extenderv1.HostPriorityList
	}{
		{vgpu.PolicyBinpack, extenderv1.HostPriorityList{{Host: "empty", Score: 2}, {Host: "used", Score: 8}, {Host: "full", Score: 0}, {Host: "ghost", Score: 0}}},
		{vgpu.PolicySpread, extenderv1.HostPriorityList{{Host: "empty", Score: 8}, {Host: "used", Score: 2}, {Host: "full", Score: 0}, {Host: "ghost", Score: 0}}},
	}
	for _, tt := range tests {
		t.Run(string(tt.policy), func(t *testing.T) {
			cfg := testConfig()
			cfg.NodePolicy = tt.policy
			e := newEnv(t, cfg, objects(empty, used, full, pods)...)
			waitFor(t, "pods counted", func() bool {
				return e.s.NodeUsage("full").GPU("full-GPU-0").MemoryMiB == 9000 && e.s.NodeUsage("used").GPU("used-GPU-0").MemoryMiB == 6000
			})
			if diff := cmp.Diff(tt.want, e.prioritize(pod, "empty", "used", "full", "ghost")); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			// The pod's annotation overrides the configured policy.
			other := vgpu.PolicySpread
			if tt.policy == vgpu.PolicySpread {
				other = vgpu.PolicyBinpack
			}
			annotated := vgputest.Pod("q").Annotation(vgpu.AnnotationNodePolicy, string(other)).Container("main").GPU(1).MemoryMiB(2000).Obj()
			got := e.prioritize(annotated, "empty", "used")
			if (got[0].Score > got[1].Score) == (tt.want[0].Score > tt.want[1].Score) {
				t.Errorf("hami.io/node-policy=%s did not reverse the order: %v", other, got)
			}
		})
	}
}

func TestScaleScore(t *testing.T) {
	for in, want := range map[int]int64{-5: 0, 0: 0, 4: 0, 5: 1, 14: 1, 15: 2, 95: 10, 100: 10, 250: 10} {
		if got := scaleScore(in); got != want {
			t.Errorf("scaleScore(%d) = %d, want %d", in, got, want)
		}
	}
}

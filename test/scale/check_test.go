package scale

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuslice/gpuslice/vgpu"
)

// testNode is a hollow node with two 16 GiB GPUs and 4 slices each.
func testNode() NodeSpec {
	inv := vgpu.NodeInventory{Node: "n1", SplitCount: 4, MemoryScaling: 1}
	for i, uuid := range []string{"GPU-a", "GPU-b"} {
		inv.GPUs = append(inv.GPUs, vgpu.GPU{UUID: uuid, Index: i, Minor: i, Model: "T4", TotalMemoryMiB: 16384, SchedulableMemoryMiB: 16384, CoresPercent: 100, NUMANode: -1, Health: vgpu.Healthy})
	}
	return NodeSpec{Name: "n1", CPUMilli: 8000, MemoryMiB: 32768, Inventory: inv}
}

// boundPod is a pod bound to n1 asking for limits, with allocation a (none when nil).
func boundPod(t *testing.T, name string, limits corev1.ResourceList, a *vgpu.PodAllocation) *corev1.Pod {
	t.Helper()
	p := pod(name, limits)
	p.Namespace, p.Spec.NodeName = "scale", "n1"
	if a != nil {
		raw, err := vgpu.EncodePodAllocation(*a)
		if err != nil {
			t.Fatal(err)
		}
		p.Annotations = map[string]string{vgpu.AnnotationPodAllocation: raw}
	}
	return p
}

func slice(uuid string, mib int64, cores int) *vgpu.PodAllocation {
	return &vgpu.PodAllocation{Node: "n1", Containers: []vgpu.ContainerAllocation{{Name: "main", GPUs: []vgpu.GPUSlice{{UUID: uuid, MemoryMiB: mib, CoresPercent: cores}}}}}
}

func limits(mib int64, cores int64) corev1.ResourceList {
	l := corev1.ResourceList{vgpu.ResourceGPU: resource.MustParse("1"), vgpu.ResourceMemory: *resource.NewQuantity(mib, resource.DecimalSI)}
	if cores > 0 {
		l[vgpu.ResourceCores] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	return l
}

func TestCheckPods(t *testing.T) {
	t.Parallel()
	nodes := nodeIndex([]NodeSpec{testNode()})
	whole := corev1.ResourceList{vgpu.ResourceGPU: resource.MustParse("1")}
	tests := map[string]struct {
		pods []*corev1.Pod
		// want are substrings of the violations, in order; none means a clean check.
		want []string
	}{
		"fits": {pods: []*corev1.Pod{
			boundPod(t, "a", limits(8192, 50), slice("GPU-a", 8192, 50)),
			boundPod(t, "b", limits(8192, 50), slice("GPU-a", 8192, 50)),
			boundPod(t, "c", whole, slice("GPU-b", 16384, 100)),
		}},
		"plain and unbound pods are not checked": {pods: []*corev1.Pod{pod("plain", nil), pod("pending", limits(1024, 0))}},
		"no allocation":                          {pods: []*corev1.Pod{boundPod(t, "a", limits(1024, 0), nil)}, want: []string{"pod scale/a on n1: bound without a hami.io/gpu-allocation annotation"}},
		"unknown GPU":                            {pods: []*corev1.Pod{boundPod(t, "a", limits(1024, 0), slice("GPU-z", 1024, 0))}, want: []string{"GPU GPU-z is not the node's"}},
		"other size":                             {pods: []*corev1.Pod{boundPod(t, "a", limits(1024, 10), slice("GPU-a", 2048, 10))}, want: []string{"has 2048 MiB and 10% cores, asked for 1024 MiB (0%) and 10%"}},
		"memory over":                            {pods: []*corev1.Pod{boundPod(t, "a", limits(10240, 0), slice("GPU-a", 10240, 0)), boundPod(t, "b", limits(10240, 0), slice("GPU-a", 10240, 0))}, want: []string{"node n1 GPU GPU-a over-committed: 20480 MiB of 16384, 0% of 100% cores, 2 slices of 4"}},
		"cores over":                             {pods: []*corev1.Pod{boundPod(t, "a", limits(1024, 60), slice("GPU-a", 1024, 60)), boundPod(t, "b", limits(1024, 60), slice("GPU-a", 1024, 60))}, want: []string{"2048 MiB of 16384, 120% of 100% cores"}},
		"exclusive plus slice":                   {pods: []*corev1.Pod{boundPod(t, "a", whole, slice("GPU-b", 16384, 100)), boundPod(t, "b", limits(1024, 0), slice("GPU-b", 1024, 0))}, want: []string{"GPU GPU-b over-committed: 17408 MiB of 16384, 100% of 100% cores, 5 slices of 4"}},
		"slices over": {pods: func() []*corev1.Pod {
			var pods []*corev1.Pod
			for _, n := range []string{"a", "b", "c", "d", "e"} {
				pods = append(pods, boundPod(t, n, limits(1024, 0), slice("GPU-a", 1024, 0)))
			}
			return pods
		}(), want: []string{"5120 MiB of 16384, 0% of 100% cores, 5 slices of 4"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res := CheckPods(tc.pods, nodes)
			if len(res.Violations) != len(tc.want) {
				t.Fatalf("got %d violations, want %d:\n%v", len(res.Violations), len(tc.want), res.Err())
			}
			for i, w := range tc.want {
				if !strings.Contains(res.Violations[i].Error(), w) {
					t.Errorf("violation %d = %q, want it to contain %q", i, res.Violations[i], w)
				}
			}
		})
	}
}

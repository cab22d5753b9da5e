package extender

import (
	"fmt"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

// TestOnlineWorkload checks that the extender measures fragmentation
// against the pods it saw arrive, as gpuslice simulate does: bound pods
// of the first list and pods created later, GPU pods and others, with the
// cluster's healthy GPUs by model as supply, and that every node summary
// is rebuilt for the new workload.
func TestOnlineWorkload(t *testing.T) {
	t.Parallel()
	invA, a := gpuNode("a", 2, 32768)
	_, b := gpuNode("b", 2, 16384)
	bound := boundPod(vgputest.Pod("bound").MemoryPercent(50), vgputest.Allocation("a").Slice(invA.GPUs[0].UUID, 16384, 0).Obj())
	cfg := testConfig()
	cfg.NodePolicy, cfg.GPUPolicy = vgpu.PolicyFragmentation, vgpu.PolicyFragmentation
	e := newEnv(t, cfg, objects(a, b, []runtime.Object{bound})...)
	pods := []*corev1.Pod{bound}
	for i := range 30 {
		p := vgputest.Pod(fmt.Sprintf("share-%d", i)).MemoryPercent(25).Obj()
		if i%3 == 0 {
			p = vgputest.Pod(fmt.Sprintf("cpu-%d", i)).Request(corev1.ResourceCPU, "2").Obj()
		}
		e.createPod(p)
		pods = append(pods, p)
	}

	want := &vgpu.Workload{}
	want.SetHalfLife(DefaultWorkloadHalfLife)
	for _, p := range pods {
		d, err := cluster.DemandOf(p)
		if err != nil {
			t.Fatal(err)
		}
		want.Add(d.Pod)
	}
	want.SetSupply(map[string]int{invA.GPUs[0].Model: 4})
	// Shares are what the workload means; weights grow with each pod.
	shares := func(w *vgpu.Workload) map[string]float64 {
		out := map[string]float64{}
		var total float64
		for _, c := range w.Classes() {
			total += c.Weight
		}
		for _, c := range w.Classes() {
			c.Weight /= total
			out[fmt.Sprintf("%d/%d%%/%+v", c.GPUs, c.MemoryPercent, c.Host)] = c.Weight
		}
		return out
	}
	approx := cmp.Comparer(func(x, y float64) bool { return math.Abs(x-y) < 1e-9 })
	st := e.s.state
	var got *vgpu.Workload
	waitFor(t, "every pod counted and every summary measured against the snapshot", func() bool {
		got = st.Workload()
		if !st.MeasuredAgainst(got) {
			return false
		}
		return cmp.Equal(shares(want), shares(got), approx)
	})
	node := vgpu.NodeState{Inventory: *invA, Usage: e.s.NodeUsage("a")}
	if g, w := vgpu.Fragmentation(node, got), vgpu.Fragmentation(node, want); math.Abs(g-w) > 1e-9 {
		t.Errorf("Fragmentation() against the extender's workload = %v, want %v (same classes and supply)", g, w)
	}
	if g, d := vgpu.Fragmentation(node, got), vgpu.Fragmentation(node, vgpu.DefaultWorkload()); g == d {
		t.Errorf("Fragmentation() = %v against both the online and the default workload; the test cannot tell them apart", g)
	}
}

// TestFixedWorkload checks that workload "default" never learns.
func TestFixedWorkload(t *testing.T) {
	t.Parallel()
	_, a := gpuNode("a", 2, 32768)
	cfg := testConfig()
	cfg.Workload = WorkloadDefault
	e := newEnv(t, cfg, a...)
	e.createPod(vgputest.Pod("share").MemoryPercent(25).Obj())
	if e.s.workload != nil {
		t.Fatal("workload default: the extender counts pods")
	}
	want := vgpu.DefaultWorkload().Classes()
	if diff := cmp.Diff(want, e.s.state.Workload().Classes()); diff != "" {
		t.Errorf("workload mismatch (-want +got):\n%s", diff)
	}
}

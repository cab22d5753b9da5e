package drascore

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// noHosts is a cluster state without nodes: its workload, and no node's free CPU and memory.
type noHosts struct{ workload *vgpu.Workload }

func (h noHosts) ReadHosts(fn func(w *vgpu.Workload, hostFree func(node string) *vgpu.HostResources)) {
	fn(h.workload, func(string) *vgpu.HostResources { return nil })
}

// newTestState is a State fitting under the fragmentation policy beside a cluster state without
// nodes.
func newTestState() *State {
	return New(vgpu.FitOptions{NodePolicy: vgpu.PolicyFragmentation}, noHosts{vgpu.DefaultWorkload()})
}

// TestDRAState checks how the DRA state follows its objects: a slice's newest pool generation
// only, no device of an incomplete pool, a tainted device unhealthy, usage that follows claims
// allocated, changed and deleted, whole devices for results without consumed capacity, and the
// nodes' GPUs in the workload's supply.
func TestDRAState(t *testing.T) {
	d := newTestState()
	sl := vgputest.DRANodeSlice("n1", 2, 16384, "Tesla T4")
	sl.Spec.Devices[1].Taints = []resourcev1.DeviceTaint{{Key: "x", Effect: resourcev1.DeviceTaintEffectNoSchedule}}
	d.UpsertSlice(sl)
	stale := sl.DeepCopy()
	stale.Name, stale.Spec.Pool.Generation = "n1-old", 0
	d.UpsertSlice(stale)
	if got := d.nodes["n1"].inv.GPUs; len(got) != 2 || got[1].Health != vgpu.Unhealthy || got[0].SchedulableMemoryMiB != 16384 || got[0].UUID != "n1-GPU-0" {
		t.Errorf("n1 GPUs %+v; want the newest generation's two, the tainted one unhealthy", got)
	}
	if diff := cmp.Diff(map[string]int{"Tesla T4": 1}, d.Supply()); diff != "" {
		t.Errorf("supply (-want +got):\n%s", diff)
	}
	incomplete := vgputest.DRANodeSlice("n2", 1, 16384, "Tesla T4")
	incomplete.Spec.Pool.ResourceSliceCount = 2
	d.UpsertSlice(incomplete)
	if got := d.nodes["n2"].inv.GPUs; len(got) != 0 {
		t.Errorf("incomplete pool: GPUs %+v, want none", got)
	}

	c := vgputest.Claim("c").Request("gpu", vgpu.DRADriverName, 1, 4096, 30).Allocated("gpu", "n1", "gpu-0", 4096, 30).Obj()
	d.UpsertClaim(c)
	if got := d.nodes["n1"].usage.GPU("n1-GPU-0"); got != (vgpu.GPUUsage{MemoryMiB: 4096, CoresPercent: 30, Slices: 1}) {
		t.Errorf("usage after allocation %+v", got)
	}
	c.Status.Allocation.Devices.Results[0].ConsumedCapacity = nil // a whole device
	d.UpsertClaim(c)
	if got := d.nodes["n1"].usage.GPU("n1-GPU-0"); got != (vgpu.GPUUsage{MemoryMiB: 16384, CoresPercent: 100, Slices: 1, Exclusive: 1}) {
		t.Errorf("usage of a whole device %+v", got)
	}
	d.DeleteClaim(c)
	if got := d.nodes["n1"].usage.GPU("n1-GPU-0"); got != (vgpu.GPUUsage{}) {
		t.Errorf("usage after delete %+v", got)
	}
	// A claim seen before its slice counts once the slice arrives.
	d.UpsertClaim(vgputest.Claim("early").Allocated("gpu", "n3", "gpu-0", 1024, 0).Obj())
	d.UpsertSlice(vgputest.DRANodeSlice("n3", 1, 16384, "Tesla T4"))
	if got := d.nodes["n3"].usage.GPU("n3-GPU-0").MemoryMiB; got != 1024 {
		t.Errorf("claim before slice: %d MiB, want 1024", got)
	}
	d.DeleteSlice(sl)
	d.DeleteSlice(stale)
	if _, ok := d.nodes["n1"]; ok {
		t.Error("n1 kept after its slices were deleted")
	}
}

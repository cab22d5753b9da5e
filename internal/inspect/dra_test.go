package inspect

import (
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// draDevice is one GPU as the DRA driver publishes it.
func draDevice(index int64, uuid string, tainted bool) resourcev1.Device {
	d := resourcev1.Device{
		Name: "gpu-" + strconv.FormatInt(index, 10),
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"uuid": {StringValue: ptr.To(uuid)}, "model": {StringValue: ptr.To("A100-80GB")}, "index": {IntValue: ptr.To(index)},
		},
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			"memory": {Value: *resource.NewQuantity(81920<<20, resource.BinarySI)},
			"cores":  {Value: *resource.NewQuantity(100, resource.DecimalSI)},
		},
	}
	if tainted {
		d.Taints = []resourcev1.DeviceTaint{{Key: "gpuslice.hami.io/unhealthy", Value: "Unhealthy", Effect: resourcev1.DeviceTaintEffectNoSchedule}}
	}
	return d
}

// draClaim is an allocated claim of pod on device of node, consuming memMiB (0: no consumed
// capacity, the whole device) and cores.
func draClaim(pod, node, device string, memMiB, cores int64) resourcev1.ResourceClaim {
	r := resourcev1.DeviceRequestAllocationResult{Request: "main", Driver: DRADriverName, Pool: node, Device: device}
	if memMiB > 0 {
		r.ConsumedCapacity = map[resourcev1.QualifiedName]resource.Quantity{
			"memory": *resource.NewQuantity(memMiB<<20, resource.BinarySI), "cores": *resource.NewQuantity(cores, resource.DecimalSI),
		}
	}
	return resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: pod + "-gpu", Namespace: "default"},
		Status: resourcev1.ResourceClaimStatus{
			Allocation:  &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{r}}},
			ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod}},
		},
	}
}

// TestStatusAndDoctorDRA checks that a DRA-mode node is shown from its ResourceSlice and the
// allocated claims beside a device-plugin node, and gets the DRA checks instead of the device
// plugin's.
func TestStatusAndDoctorDRA(t *testing.T) {
	s := fixture()
	s.Nodes = append(s.Nodes, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dra-1", Labels: map[string]string{vgpu.LabelNodeMode: vgpu.NodeModeDRA}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: vgpu.ConditionRegistered, Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered,
			Message: "registered DRA driver gpuslice.hami.io with the kubelet: 1 of 2 GPUs healthy, in ResourceSlice pool dra-1"}}}})
	s.Leases["dra-1"] = *vgputest.HeartbeatLease("dra-1", s.Now).Obj()
	s.ResourceSlices = []resourcev1.ResourceSlice{{Spec: resourcev1.ResourceSliceSpec{
		Driver: DRADriverName, NodeName: ptr.To("dra-1"), Pool: resourcev1.ResourcePool{Name: "dra-1"},
		Devices: []resourcev1.Device{draDevice(0, "GPU-d0", false), draDevice(1, "GPU-d1", true)},
	}}}
	s.ResourceClaims = []resourcev1.ResourceClaim{
		draClaim("a", "dra-1", "gpu-0", 10240, 30), draClaim("b", "dra-1", "gpu-0", 4096, 0), draClaim("c", "dra-1", "gpu-1", 0, 0),
		draClaim("elsewhere", "dra-2", "gpu-0", 4096, 0),
	}
	got, err := Status(s, "dra-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeStatus{{Name: "dra-1", Mode: ModeDRA, Ready: true, GPUs: []GPUStatus{
		{Index: 0, UUID: "GPU-d0", Model: "A100-80GB", Health: vgpu.Healthy, MemoryUsedMiB: 14336, MemoryMiB: 81920, CoresUsedPercent: 30, CoresPercent: 100, Slices: 2, Pods: []string{"default/a", "default/b"}},
		{Index: 1, UUID: "GPU-d1", Model: "A100-80GB", Health: vgpu.Unhealthy, MemoryUsedMiB: 81920, MemoryMiB: 81920, CoresPercent: 100, Slices: 1, Exclusive: true, Pods: []string{"default/c"}},
	}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Status(dra-1) (-want +got):\n%s", diff)
	}
	all, err := Status(s, "")
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]int{}
	for _, n := range all {
		modes[n.Mode]++
	}
	if modes[ModeDRA] != 1 || modes[ModeDevicePlugin] == 0 {
		t.Errorf("Status of the whole cluster: modes %v, want the DRA node beside the device-plugin nodes", modes)
	}

	r, err := Doctor(s, []string{"dra-1"})
	if err != nil {
		t.Fatal(err)
	}
	var checks []Check
	for _, c := range r.Checks {
		if c.Node == "dra-1" {
			checks = append(checks, c)
		}
	}
	wantChecks := []Check{
		{Node: "dra-1", Name: "dra-driver", Result: Pass, Message: "DRA mode: the driver publishes 2 GPUs"},
		{Node: "dra-1", Name: "dra-health", Result: Warn, Message: "tainted (no new claims there): gpu-1 (gpuslice.hami.io/unhealthy=Unhealthy)",
			Fix: "see the GPU's XIDs in the driver's log and docs/health.md; the taint goes when the GPU recovers"},
		{Node: "dra-1", Name: "condition", Result: Pass,
			Message: "GPUSliceRegistered=True (Registered): registered DRA driver gpuslice.hami.io with the kubelet: 1 of 2 GPUs healthy, in ResourceSlice pool dra-1"},
		{Node: "dra-1", Name: "heartbeat", Result: Pass, Message: "Lease kube-node-lease/gpuslice-dra-1 renewed 0s ago (duration 40s, plugin test)"},
	}
	if diff := cmp.Diff(wantChecks, checks); diff != "" {
		t.Errorf("doctor checks of dra-1 (-want +got):\n%s", diff)
	}
}

package inspect

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// verdictOn returns pod's verdict on node.
func verdictOn(t *testing.T, r WhyReport, node string) NodeVerdict {
	t.Helper()
	for _, v := range r.Nodes {
		if v.Node == node {
			return v
		}
	}
	t.Fatalf("no verdict for %s in %+v", node, r)
	return NodeVerdict{}
}

// TestWhyReasons gives node gpu-a of the fixture each state the extender turns a node away for,
// and checks why's reason and words.
func TestWhyReasons(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		brk     func(s *Snapshot)
		reason  vgpu.Reason
		message string
	}{
		"no inventory":        {func(s *Snapshot) { delete(nodeOf(s, "gpu-a").Annotations, vgpu.AnnotationNodeInventory) }, vgpu.ReasonNoInventory, "plugin not ready: no hami.io/node-gpu-inventory annotation on the node"},
		"malformed inventory": {func(s *Snapshot) { nodeOf(s, "gpu-a").Annotations[vgpu.AnnotationNodeInventory] = "{" }, vgpu.ReasonMalformedInventory, ""},
		"label missing":       {func(s *Snapshot) { delete(nodeOf(s, "gpu-a").Labels, vgpu.LabelGPUReady) }, vgpu.ReasonReadyLabel, "plugin not ready: label hami.io/gpu.ready is missing"},
		"label false":         {func(s *Snapshot) { nodeOf(s, "gpu-a").Labels[vgpu.LabelGPUReady] = "false" }, vgpu.ReasonReadyLabel, `plugin not ready: label hami.io/gpu.ready is "false"`},
		"label garbled":       {func(s *Snapshot) { nodeOf(s, "gpu-a").Labels[vgpu.LabelGPUReady] = "1" }, vgpu.ReasonReadyLabel, `plugin not ready: label hami.io/gpu.ready is "1" (must be "true" or "false")`},
		"no allocatable":      {func(s *Snapshot) { delete(nodeOf(s, "gpu-a").Status.Allocatable, vgpu.ResourceGPU) }, vgpu.ReasonNoAllocatable, "plugin not ready: allocatable hami.io/gpu is 0"},
		"no lease":            {func(s *Snapshot) { delete(s.Leases, "gpu-a") }, vgpu.ReasonNoHeartbeat, "plugin not ready: no heartbeat Lease in namespace kube-node-lease"},
		"no renewTime": {func(s *Snapshot) {
			s.Leases["gpu-a"] = *vgputest.HeartbeatLease("gpu-a", now).RenewedAt(time.Time{}).Obj()
		}, vgpu.ReasonNoHeartbeat, "plugin not ready: heartbeat Lease has no renewTime"},
		"stale":          {func(s *Snapshot) { s.Now = s.Now.Add(2 * time.Minute) }, vgpu.ReasonStaleHeartbeat, "plugin not ready: heartbeat Lease not renewed for more than 1m0s"},
		"not registered": {func(s *Snapshot) { s.Leases["gpu-a"] = s.Leases["gpu-c"] }, vgpu.ReasonNotRegistered, "plugin not ready: heartbeat says the device plugin is not registered with the kubelet"},
		"too big":        {func(*Snapshot) {}, vgpu.ReasonInsufficientMemory, "insufficient memory: needs 100000 MiB on 1 GPU"},
		"invalid request": {func(s *Snapshot) {
			s.Pods[0].Annotations = map[string]string{vgpu.AnnotationNodePolicy: "tetris"}
		}, ReasonInvalidRequest, ""},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := fixture()
			tt.brk(s)
			v := verdictOn(t, Why(s, &s.Pods[0]), "gpu-a")
			if v.Fits || v.Reason != tt.reason || (tt.message != "" && v.Message != tt.message) {
				t.Errorf("verdict %+v, want reason %s, message %q", v, tt.reason, tt.message)
			}
			if name == "too big" && v.Detail != "insufficient memory: needs 100000 MiB, largest free 81920 MiB on GPU-a1" {
				t.Errorf("detail %q, want the message naming the largest free GPU", v.Detail)
			}
		})
	}
}

func TestWhyFits(t *testing.T) {
	t.Parallel()
	s := fixture()
	// 30720 MiB still fits next to the two pods on GPU-a0: the spread GPU policy of the fixture's
	// extender settings picks the empty GPU-a1.
	pod := vgputest.Pod("medium").Container("main").GPU(1).MemoryMiB(30720).Obj()
	r := Why(s, pod)
	want := NodeVerdict{Node: "gpu-a", Fits: true, GPUs: []string{"GPU-a1"}}
	if diff := cmp.Diff(want, verdictOn(t, r, "gpu-a")); diff != "" {
		t.Errorf("gpu-a verdict (-want +got):\n%s", diff)
	}
	if r.Closest != "" {
		t.Errorf("closest = %q with a node that fits, want none", r.Closest)
	}
	// With the binpack GPU policy (the default, no extender settings) it joins the used GPU.
	s.ConfigMaps = nil
	if got := verdictOn(t, Why(s, pod), "gpu-a").GPUs; !cmp.Equal(got, []string{"GPU-a0"}) {
		t.Errorf("binpack GPUs = %v, want [GPU-a0]", got)
	}
}

func TestWhyClosest(t *testing.T) {
	t.Parallel()
	s := fixture()
	// gpu-d passes every filter gpu-a does but the memory one too, with more free memory.
	inv := vgputest.Node("gpu-d").GPU("GPU-d0", 98304).SplitCount(4).Obj()
	s.Nodes = append(s.Nodes, *vgputest.PublishedNode(inv).Obj())
	s.Leases["gpu-d"] = *vgputest.HeartbeatLease("gpu-d", now).Obj()
	r := Why(s, &s.Pods[0])
	if r.Closest != "gpu-d" {
		t.Errorf("closest = %q, want gpu-d (most free memory): %+v", r.Closest, r.Nodes)
	}
}

func TestWhyBound(t *testing.T) {
	t.Parallel()
	s := fixture()
	r := Why(s, &s.Pods[1])
	if r.BoundTo != "gpu-a" || len(r.Nodes) != 0 {
		t.Errorf("Why(bound pod) = %+v, want BoundTo gpu-a and no verdicts", r)
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	s := fixture()
	whole := vgputest.Pod("whole").Container("main").GPU(1).NodeName("gpu-a").Obj()
	a, err := vgpu.EncodePodAllocation(vgputest.Allocation("gpu-a").Container("main").Slice("GPU-a1", 81920, 100).Obj())
	if err != nil {
		t.Fatal(err)
	}
	whole.Annotations = map[string]string{vgpu.AnnotationPodAllocation: a}
	done := placedPodObj("done", "gpu-a", "GPU-a1", 1024, 0)
	done.Status.Phase = corev1.PodSucceeded
	elsewhere := placedPodObj("elsewhere", "gpu-b", "GPU-a1", 1024, 0)
	elsewhere.Spec.NodeName = "gpu-a"
	s.Pods = append(s.Pods, *whole, done, elsewhere)
	got, err := Status(s, "gpu-a")
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeStatus{{Name: "gpu-a", Mode: ModeDevicePlugin, Ready: true, Allocatable: 8, SplitCount: 4, GPUs: []GPUStatus{
		{Index: 0, UUID: "GPU-a0", Model: "NVIDIA A100-SXM4-80GB", Health: vgpu.Healthy, MemoryUsedMiB: 51200, MemoryMiB: 81920,
			CoresUsedPercent: 70, CoresPercent: 100, Slices: 2, SplitCount: 4, Pods: []string{"default/infer", "default/train"}},
		// The whole-GPU pod counts; the finished pod and the one whose allocation names another node do not.
		{Index: 1, UUID: "GPU-a1", Model: "NVIDIA A100-SXM4-80GB", Health: vgpu.Healthy, MemoryUsedMiB: 81920, MemoryMiB: 81920,
			CoresUsedPercent: 100, CoresPercent: 100, Slices: 1, SplitCount: 4, Exclusive: true, Pods: []string{"default/whole"}},
	}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Status(gpu-a) (-want +got):\n%s", diff)
	}
	if _, err := Status(s, "cpu-1"); err == nil {
		t.Error("Status(cpu-1) = nil error, want: no such GPU node")
	}
}

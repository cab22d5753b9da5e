package extender

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// draEnv starts a Scheduler with DRA scoring under policy over objs.
func draEnv(t *testing.T, policy vgpu.Policy, objs ...runtime.Object) *env {
	t.Helper()
	cfg := testConfig()
	cfg.DRA, cfg.NodePolicy = true, policy
	return newEnv(t, cfg, objs...)
}

// prioritizeDRA calls /dra/prioritize with node names.
func (e *env) prioritizeDRA(pod *corev1.Pod, names ...string) extenderv1.HostPriorityList {
	e.t.Helper()
	var out extenderv1.HostPriorityList
	if code, body := e.post("/dra/prioritize", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}, &out); code != http.StatusOK {
		e.t.Fatalf("/dra/prioritize: HTTP %d: %s", code, body)
	}
	return out
}

// waitDRAUsage waits until node's GPU uuid holds memMiB.
func (e *env) waitDRAUsage(node, uuid string, memMiB int64) {
	e.t.Helper()
	waitFor(e.t, node+" usage counted", func() bool {
		e.s.dra.mu.RLock()
		defer e.s.dra.mu.RUnlock()
		n := e.s.dra.nodes[node]
		return n != nil && n.usage.GPU(uuid).MemoryMiB == memMiB
	})
}

// hostList is the scores of names, in order.
func hostList(names []string, scores ...int64) extenderv1.HostPriorityList {
	out := extenderv1.HostPriorityList{}
	for i, n := range names {
		out = append(out, extenderv1.HostPriority{Host: n, Score: scores[i]})
	}
	return out
}

// TestPrioritizeDRA checks the DRA scoring on two DRA nodes of two 80 GiB GPUs, one of them
// with a 40 GiB claim allocated on its first GPU, a device-plugin node and a node unknown to
// the extender: binpack prefers the used node, spread the empty one, fragmentation the used
// one (a 20 GiB slice beside the 40 GiB one fragments nothing there); the device-plugin and
// unknown nodes score 0. A slice that no GPU of the used node has room for scores 0 there.
func TestPrioritizeDRA(t *testing.T) {
	used := vgputest.DRANodeSlice("dra-used", 2, 81920, "NVIDIA A100-SXM4-80GB")
	empty := vgputest.DRANodeSlice("dra-empty", 2, 81920, "NVIDIA A100-SXM4-80GB")
	_, dp := gpuNode("dp", 2, 81920)
	held := vgputest.Claim("held").Request("gpu", vgpu.DRADriverName, 1, 40960, 0).Allocated("gpu", "dra-used", "gpu-0", 40960, 0).Obj()
	pod, claim := vgputest.DRAPod("p", vgputest.Claim("p-gpu").Request("gpu", vgpu.DRADriverName, 1, 20480, 20))
	names := []string{"dra-used", "dra-empty", "dp", "ghost"}
	objs := objects(dp, []runtime.Object{used, empty, vgputest.DRAClass(), held, claim, pod})
	for _, tt := range []struct {
		policy vgpu.Policy
		want   extenderv1.HostPriorityList
	}{
		{vgpu.PolicyBinpack, hostList(names, 10, 9, 0, 0)},
		{vgpu.PolicySpread, hostList(names, 9, 10, 0, 0)},
		{vgpu.PolicyFragmentation, hostList(names, 10, 9, 0, 0)},
	} {
		t.Run(string(tt.policy), func(t *testing.T) {
			e := draEnv(t, tt.policy, objs...)
			e.waitDRAUsage("dra-used", "dra-used-GPU-0", 40960)
			if diff := cmp.Diff(tt.want, e.prioritizeDRA(pod, names...)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}

	// Two devices of 70 GiB: the used node has one GPU with that much free, the empty node two.
	e := draEnv(t, vgpu.PolicyBinpack, objs...)
	e.waitDRAUsage("dra-used", "dra-used-GPU-0", 40960)
	big, bigClaim := vgputest.DRAPod("big", vgputest.Claim("big-gpu").Request("gpu", vgpu.DRADriverName, 2, 71680, 0))
	if _, err := e.client.ResourceV1().ResourceClaims("default").Create(context.Background(), bigClaim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "claim seen", func() bool { return len(e.s.dra.draPodFor(big).requests) == 1 })
	if diff := cmp.Diff(hostList(names[:2], 0, 10), e.prioritizeDRA(big, names[:2]...)); diff != "" {
		t.Errorf("two 70 GiB devices (-want +got):\n%s", diff)
	}
	// Once the claim is allocated it places nothing new: neutral.
	bigClaim.Status.Allocation = &resourcev1.AllocationResult{}
	if _, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), bigClaim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "allocation seen", func() bool { return len(e.s.dra.draPodFor(big).requests) == 0 })
	if diff := cmp.Diff(hostList(names[:2], 0, 0), e.prioritizeDRA(big, names[:2]...)); diff != "" {
		t.Errorf("allocated claim (-want +got):\n%s", diff)
	}
}

// draPodFor is draPodLocked under the read lock, for tests.
func (d *draState) draPodFor(pod *corev1.Pod) draPod {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.draPodLocked(pod)
}

// TestPrioritizeDRASelectors checks that the scoring selects devices as the allocator does: a
// node of T4s scores 0 for the webhook's A100 selector and for a model class (the chart's
// dra.modelClasses); a 50 GiB slice fits the A100 node on its second GPU, but not with a UUID
// selector that names only its first GPU, which holds 40 GiB already.
func TestPrioritizeDRASelectors(t *testing.T) {
	a100 := vgputest.DRANodeSlice("a100", 2, 81920, "NVIDIA A100-SXM4-80GB")
	t4 := vgputest.DRANodeSlice("t4", 2, 15360, "Tesla T4")
	held := vgputest.Claim("held").Request("gpu", vgpu.DRADriverName, 1, 40960, 0).Allocated("gpu", "a100", "gpu-0", 40960, 0).Obj()
	modelSel := `device.attributes["gpuslice.hami.io"].model.lowerAscii().contains("a100")`
	modelClass := vgputest.DRAClassWith("gpuslice-a100", `device.driver == "gpuslice.hami.io" && device.attributes["gpuslice.hami.io"].model == "NVIDIA A100-SXM4-80GB"`)
	byModel, byModelClaim := vgputest.DRAPod("m", vgputest.Claim("m-gpu").Request("gpu", vgpu.DRADriverName, 1, 8192, 0).Selector(modelSel))
	byClass, byClassClaim := vgputest.DRAPod("c", vgputest.Claim("c-gpu").Request("gpu", "gpuslice-a100", 1, 8192, 0))
	bySize, bySizeClaim := vgputest.DRAPod("s", vgputest.Claim("s-gpu").Request("gpu", vgpu.DRADriverName, 1, 51200, 0))
	byUUID, byUUIDClaim := vgputest.DRAPod("u", vgputest.Claim("u-gpu").Request("gpu", vgpu.DRADriverName, 1, 51200, 0).
		Selector(`device.attributes["gpuslice.hami.io"].uuid in ["a100-GPU-0"]`))
	e := draEnv(t, vgpu.PolicyBinpack, a100, t4, vgputest.DRAClass(), modelClass, held, byModelClaim, byClassClaim, bySizeClaim, byUUIDClaim)
	e.waitDRAUsage("a100", "a100-GPU-0", 40960)
	names := []string{"a100", "t4"}
	for _, pod := range []*corev1.Pod{byModel, byClass} {
		if diff := cmp.Diff(hostList(names, 10, 0), e.prioritizeDRA(pod, names...)); diff != "" {
			t.Errorf("pod %s (-want +got):\n%s", pod.Name, diff)
		}
	}
	if diff := cmp.Diff(hostList(names, 10, 0), e.prioritizeDRA(bySize, names...)); diff != "" {
		t.Errorf("50 GiB (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(hostList(names, 0, 0), e.prioritizeDRA(byUUID, names...)); diff != "" {
		t.Errorf("50 GiB on a100-GPU-0 only (-want +got):\n%s", diff)
	}
	// The workload's class of the model pod carries the model filter.
	e.s.dra.mu.RLock()
	d := e.s.dra.draPodLocked(byModel).demand([]int{0})
	e.s.dra.mu.RUnlock()
	if diff := cmp.Diff([]string{"a100"}, d.Constraints.Models); diff != "" {
		t.Errorf("model filter of the workload class (-want +got):\n%s", diff)
	}
}

// TestPrioritizeDRANeutral checks the pods every node scores 0 for: no claim, a claim not in
// the cache, a claim of another driver's class, a claim made from a template that the pod does
// not own, a prioritized list of gpuslice's class (which kube-scheduler scores itself), and any
// pod before the informers synced or without Config.DRA.
func TestPrioritizeDRANeutral(t *testing.T) {
	used := vgputest.DRANodeSlice("dra-a", 2, 81920, "NVIDIA A100-SXM4-80GB")
	other := vgputest.DRANodeSlice("dra-b", 2, 81920, "NVIDIA A100-SXM4-80GB")
	held := vgputest.Claim("held").Request("gpu", vgpu.DRADriverName, 1, 40960, 0).Allocated("gpu", "dra-a", "gpu-0", 40960, 0).Obj()
	nic := vgputest.DRAClassWith("nic", `device.driver == "nic.example.com"`)
	plain := vgputest.Pod("plain").Container("main").Obj()
	missing := vgputest.Pod("missing").Container("main").ClaimFromTemplate("gpu", "tmpl", "missing-gpu").Obj()
	nicPod, nicClaim := vgputest.DRAPod("n", vgputest.Claim("n-nic").Request("nic", "nic", 1, 0, 0))
	stranger, strangerClaim := vgputest.DRAPod("s", vgputest.Claim("s-gpu").Request("gpu", vgpu.DRADriverName, 1, 8192, 0))
	strangerClaim.OwnerReferences[0].UID = "someone-else"
	listPod, listClaim := vgputest.DRAPod("l", vgputest.Claim("l-gpu"))
	listClaim.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "gpu", FirstAvailable: []resourcev1.DeviceSubRequest{{Name: "a", DeviceClassName: vgpu.DRADriverName, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1}}}}
	allPod, allClaim := vgputest.DRAPod("all", vgputest.Claim("all-gpu").Request("gpu", vgpu.DRADriverName, 1, 0, 0))
	allClaim.Spec.Devices.Requests[0].Exactly.AllocationMode = resourcev1.DeviceAllocationModeAll
	objs := []runtime.Object{used, other, vgputest.DRAClass(), nic, held, nicClaim, strangerClaim, listClaim, allClaim}
	names := []string{"dra-a", "dra-b"}
	zero := hostList(names, 0, 0)
	e := draEnv(t, vgpu.PolicyBinpack, objs...)
	e.waitDRAUsage("dra-a", "dra-a-GPU-0", 40960)
	for _, pod := range []*corev1.Pod{plain, missing, nicPod, stranger, listPod, allPod} {
		if diff := cmp.Diff(zero, e.prioritizeDRA(pod, names...)); diff != "" {
			t.Errorf("pod %s (-want +got):\n%s", pod.Name, diff)
		}
	}
	// A NIC request beside a GPU request is left to its allocator: the GPU request is scored.
	mixed, mixedClaim := vgputest.DRAPod("mixed", vgputest.Claim("mixed-gpu").Request("gpu", vgpu.DRADriverName, 1, 8192, 0).Request("nic", "nic", 1, 0, 0))
	if _, err := e.client.ResourceV1().ResourceClaims("default").Create(context.Background(), mixedClaim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "claim seen", func() bool { return len(e.s.dra.draPodFor(mixed).requests) == 2 })
	if diff := cmp.Diff(hostList(names, 10, 9), e.prioritizeDRA(mixed, names...)); diff != "" {
		t.Errorf("GPU and NIC requests (-want +got):\n%s", diff)
	}

	// Without Config.DRA the endpoint answers, with zeros.
	off := newEnv(t, testConfig(), objs...)
	if diff := cmp.Diff(zero, off.prioritizeDRA(mixed, names...)); diff != "" {
		t.Errorf("without Config.DRA (-want +got):\n%s", diff)
	}
	// Before the informers synced: zeros.
	cfg := testConfig()
	cfg.DRA = true
	s, err := New(cfg, Options{Client: fake.NewClientset(objs...)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.PrioritizeDRA(context.Background(), &extenderv1.ExtenderArgs{Pod: mixed, NodeNames: &names})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(zero, got); diff != "" {
		t.Errorf("before sync (-want +got):\n%s", diff)
	}
}

// TestDRAState checks how the DRA state follows its objects: a slice's newest pool generation
// only, no device of an incomplete pool, a tainted device unhealthy, usage that follows claims
// allocated, changed and deleted, whole devices for results without consumed capacity, and the
// nodes' GPUs in the workload's supply.
func TestDRAState(t *testing.T) {
	d := newDRAState()
	sl := vgputest.DRANodeSlice("n1", 2, 16384, "Tesla T4")
	sl.Spec.Devices[1].Taints = []resourcev1.DeviceTaint{{Key: "x", Effect: resourcev1.DeviceTaintEffectNoSchedule}}
	d.upsertSlice(sl)
	stale := sl.DeepCopy()
	stale.Name, stale.Spec.Pool.Generation = "n1-old", 0
	d.upsertSlice(stale)
	if got := d.nodes["n1"].inv.GPUs; len(got) != 2 || got[1].Health != vgpu.Unhealthy || got[0].SchedulableMemoryMiB != 16384 || got[0].UUID != "n1-GPU-0" {
		t.Errorf("n1 GPUs %+v; want the newest generation's two, the tainted one unhealthy", got)
	}
	if diff := cmp.Diff(map[string]int{"Tesla T4": 1}, d.supply()); diff != "" {
		t.Errorf("supply (-want +got):\n%s", diff)
	}
	incomplete := vgputest.DRANodeSlice("n2", 1, 16384, "Tesla T4")
	incomplete.Spec.Pool.ResourceSliceCount = 2
	d.upsertSlice(incomplete)
	if got := d.nodes["n2"].inv.GPUs; len(got) != 0 {
		t.Errorf("incomplete pool: GPUs %+v, want none", got)
	}

	c := vgputest.Claim("c").Request("gpu", vgpu.DRADriverName, 1, 4096, 30).Allocated("gpu", "n1", "gpu-0", 4096, 30).Obj()
	d.upsertClaim(c)
	if got := d.nodes["n1"].usage.GPU("n1-GPU-0"); got != (vgpu.GPUUsage{MemoryMiB: 4096, CoresPercent: 30, Slices: 1}) {
		t.Errorf("usage after allocation %+v", got)
	}
	c.Status.Allocation.Devices.Results[0].ConsumedCapacity = nil // a whole device
	d.upsertClaim(c)
	if got := d.nodes["n1"].usage.GPU("n1-GPU-0"); got != (vgpu.GPUUsage{MemoryMiB: 16384, CoresPercent: 100, Slices: 1, Exclusive: 1}) {
		t.Errorf("usage of a whole device %+v", got)
	}
	d.deleteClaim("default/c")
	if got := d.nodes["n1"].usage.GPU("n1-GPU-0"); got != (vgpu.GPUUsage{}) {
		t.Errorf("usage after delete %+v", got)
	}
	// A claim seen before its slice counts once the slice arrives.
	d.upsertClaim(vgputest.Claim("early").Allocated("gpu", "n3", "gpu-0", 1024, 0).Obj())
	d.upsertSlice(vgputest.DRANodeSlice("n3", 1, 16384, "Tesla T4"))
	if got := d.nodes["n3"].usage.GPU("n3-GPU-0").MemoryMiB; got != 1024 {
		t.Errorf("claim before slice: %d MiB, want 1024", got)
	}
	d.deleteSlice(sl.Name)
	d.deleteSlice(stale.Name)
	if _, ok := d.nodes["n1"]; ok {
		t.Error("n1 kept after its slices were deleted")
	}
}

// TestDRAClaimOf checks the parsing of claims: defaults, rounding up to the driver's steps,
// what is not modelled, and consumed capacity.
func TestDRAClaimOf(t *testing.T) {
	t.Parallel()
	claim := vgputest.Claim("c").
		Request("plain", vgpu.DRADriverName, 0, 0, 0).
		Request("sized", vgpu.DRADriverName, 2, 1024, 30).
		Request("admin", vgpu.DRADriverName, 1, 0, 0).
		Request("huge", vgpu.DRADriverName, 33, 0, 0).Obj()
	claim.Spec.Devices.Requests[2].Exactly.AdminAccess = ptr.To(true)
	claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourcev1.DeviceRequest{Name: "list", FirstAvailable: []resourcev1.DeviceSubRequest{{Name: "a"}}})
	claim.Spec.Devices.Constraints = []resourcev1.DeviceConstraint{{Requests: []string{"sized"}, MatchAttribute: ptr.To(resourcev1.FullyQualifiedName("gpuslice.hami.io/numaNode"))}}
	got := draClaimOf(claim)
	want := &draClaim{namespace: "default", name: "c", numa: true, requests: []claimRequest{
		{name: "plain", class: vgpu.DRADriverName, modeled: true, count: 1},
		{name: "sized", class: vgpu.DRADriverName, modeled: true, count: 2, memoryMiB: 1024, cores: 30},
		{name: "admin", class: vgpu.DRADriverName},
		{name: "huge", class: vgpu.DRADriverName},
		{name: "list"},
	}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(draClaim{}, claimRequest{}, claimResult{})); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestSelectorModels checks the reading of the webhook's and the chart's model selectors back
// into a model filter, and that other expressions are not read.
func TestSelectorModels(t *testing.T) {
	t.Parallel()
	contains := func(m string) string {
		return `device.attributes["gpuslice.hami.io"].model.lowerAscii().contains("` + m + `")`
	}
	tests := []struct {
		expr            string
		models, exclude []string
		ok              bool
	}{
		{contains("a100"), []string{"a100"}, nil, true},
		{contains("a100") + " || " + contains("h100"), []string{"a100", "h100"}, nil, true},
		{"!(" + contains("t4") + ")", nil, []string{"t4"}, true},
		{contains(`a " || b`), nil, nil, false},
		{contains(`a \" || b`), []string{`a " || b`}, nil, true},
		{`device.driver == "gpuslice.hami.io" && device.attributes["gpuslice.hami.io"].model == "NVIDIA A100-SXM4-80GB"`, []string{"NVIDIA A100-SXM4-80GB"}, nil, true},
		{`device.attributes["gpuslice.hami.io"].uuid in ["GPU-0"]`, nil, nil, false},
		{`device.driver == "gpuslice.hami.io"`, nil, nil, false},
		{contains(""), nil, nil, false},
		{"", nil, nil, false},
	}
	for _, tt := range tests {
		models, exclude, ok := selectorModels(tt.expr)
		if diff := cmp.Diff([]any{tt.models, tt.exclude, tt.ok}, []any{models, exclude, ok}); diff != "" {
			t.Errorf("selectorModels(%q) (-want +got):\n%s", tt.expr, diff)
		}
	}
}

// TestRankScores checks the ranking onto 0..10.
func TestRankScores(t *testing.T) {
	t.Parallel()
	s := func(v int, raw float64) *vgpu.NodeScore { return &vgpu.NodeScore{Value: v, Raw: raw} }
	got := rankScores([]*vgpu.NodeScore{s(50, 0.5), nil, s(80, 0.8), s(50, 0.5), s(50, 0.4)})
	if diff := cmp.Diff([]int64{9, 0, 10, 9, 8}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	many := make([]*vgpu.NodeScore, 20)
	for i := range many {
		many[i] = s(i, 0)
	}
	if got := rankScores(many); got[0] != 1 || got[19] != 10 || got[9] != 1 {
		t.Errorf("20 distinct scores: %v; want 10 down to 1, then 1", got)
	}
}

// TestDRAWorkload checks that the online workload counts a DRA pod once, with its claims' GPU
// request and model filter, when it is first scored, and not as a pod without GPUs when the pod
// informer sees it.
func TestDRAWorkload(t *testing.T) {
	a := vgputest.DRANodeSlice("dra-a", 2, 81920, "NVIDIA A100-SXM4-80GB")
	pod, claim := vgputest.DRAPod("p", vgputest.Claim("p-gpu").Request("gpu", vgpu.DRADriverName, 1, 8192, 30).
		Selector(`device.attributes["gpuslice.hami.io"].model.lowerAscii().contains("a100")`))
	cfg := testConfig()
	cfg.DRA, cfg.NodePolicy = true, vgpu.PolicyFragmentation
	e := newEnv(t, cfg, a, vgputest.DRAClass(), claim)
	e.createPod(pod)
	waitFor(t, "claim seen", func() bool { return len(e.s.dra.draPodFor(pod).requests) == 1 })
	counted := func() int {
		e.s.workload.mu.Lock()
		defer e.s.workload.mu.Unlock()
		return e.s.workload.counted
	}
	// The pod informer's add is not counted: the pod names claims.
	if got := counted(); got != 0 {
		t.Fatalf("counted %d pods before scoring; want 0", got)
	}
	for range 2 {
		e.prioritizeDRA(pod, "dra-a")
	}
	if got := counted(); got != 1 {
		t.Fatalf("counted %d pods after scoring twice; want 1", got)
	}
	e.s.workload.mu.Lock()
	classes := e.s.workload.live.Classes()
	e.s.workload.mu.Unlock()
	want := []vgpu.WorkloadClass{{GPUs: 1, MemoryMiB: 8192, CoresPercent: 30, Models: []string{"a100"}}}
	if diff := cmp.Diff(want, classes, cmpIgnoreWeight); diff != "" {
		t.Errorf("workload classes (-want +got):\n%s", diff)
	}
}

// cmpIgnoreWeight compares workload classes by shape.
var cmpIgnoreWeight = cmp.Transformer("shape", func(c vgpu.WorkloadClass) vgpu.WorkloadClass {
	c.Weight = 0
	return c
})

// TestDRARace scores pods concurrently while claims are allocated and released on the nodes,
// for the race detector: every answer ranks 0 to 10.
func TestDRARace(t *testing.T) {
	objs := []runtime.Object{vgputest.DRAClass()}
	var names []string
	for i := range 4 {
		name := fmt.Sprintf("dra-%d", i)
		names = append(names, name)
		objs = append(objs, vgputest.DRANodeSlice(name, 4, 81920, "NVIDIA A100-SXM4-80GB"))
	}
	pod, claim := vgputest.DRAPod("p", vgputest.Claim("p-gpu").Request("gpu", vgpu.DRADriverName, 1, 8192, 10))
	objs = append(objs, claim)
	e := draEnv(t, vgpu.PolicyFragmentation, objs...)
	waitFor(t, "claim seen", func() bool { return len(e.s.dra.draPodFor(pod).requests) == 1 })
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 40 {
			c := vgputest.Claim(fmt.Sprintf("held-%d", i)).Request("gpu", vgpu.DRADriverName, 1, 4096, 0).
				Allocated("gpu", names[i%len(names)], fmt.Sprintf("gpu-%d", i%4), 4096, 0).Obj()
			if _, err := e.client.ResourceV1().ResourceClaims("default").Create(ctx, c, metav1.CreateOptions{}); err != nil {
				t.Error(err)
				return
			}
			if i%3 == 0 {
				if err := e.client.ResourceV1().ResourceClaims("default").Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				got, err := e.s.PrioritizeDRA(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
				if err != nil {
					t.Error(err)
					return
				}
				for _, h := range got {
					if h.Score < 1 || h.Score > extenderv1.MaxExtenderPriority {
						t.Errorf("score %d for %s; want 1 to 10 (the pod fits every node)", h.Score, h.Host)
					}
				}
			}
		})
	}
	wg.Wait()
	<-done
}

// BenchmarkPrioritizeDRA scores one DRA pod over 1,000 DRA nodes of 8 GPUs, each holding a few
// claims, under the fragmentation policy: the cost of one /dra/prioritize call without HTTP.
func BenchmarkPrioritizeDRA(b *testing.B) {
	const nodes = 1000
	d := newDRAState()
	s := &Scheduler{dra: d, fitOptions: vgpu.FitOptions{NodePolicy: vgpu.PolicyFragmentation},
		state: newClusterState(vgpu.ResourceGPU, time.Now, time.Minute, vgpu.DefaultWorkload())}
	d.upsertClass(vgputest.DRAClass())
	names := make([]string, nodes)
	for i := range nodes {
		names[i] = fmt.Sprintf("n%04d", i)
		d.upsertSlice(vgputest.DRANodeSlice(names[i], 8, 81920, "NVIDIA A100-SXM4-80GB"))
		for k := range i % 5 {
			d.upsertClaim(vgputest.Claim(fmt.Sprintf("held-%d-%d", i, k)).Allocated("gpu", names[i], fmt.Sprintf("gpu-%d", k), 20480, 20).Obj())
		}
	}
	pod, claim := vgputest.DRAPod("p", vgputest.Claim("p-gpu").Request("gpu", vgpu.DRADriverName, 1, 10240, 30))
	d.upsertClaim(claim)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if _, _, ok := s.draScores(ctx, pod, names); !ok {
			b.Fatal("not scored")
		}
	}
}

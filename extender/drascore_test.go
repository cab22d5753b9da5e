package extender

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

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
		return e.s.dra.NodeUsage(node).GPU(uuid).MemoryMiB == memMiB
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
	waitFor(t, "claim seen", func() bool { return e.s.dra.PodRequests(big) == 1 })
	if diff := cmp.Diff(hostList(names[:2], 0, 10), e.prioritizeDRA(big, names[:2]...)); diff != "" {
		t.Errorf("two 70 GiB devices (-want +got):\n%s", diff)
	}
	// Once the claim is allocated it places nothing new: neutral.
	bigClaim.Status.Allocation = &resourcev1.AllocationResult{}
	if _, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), bigClaim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "allocation seen", func() bool { return e.s.dra.PodRequests(big) == 0 })
	if diff := cmp.Diff(hostList(names[:2], 0, 0), e.prioritizeDRA(big, names[:2]...)); diff != "" {
		t.Errorf("allocated claim (-want +got):\n%s", diff)
	}
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
	res, ok := e.s.dra.Score(context.Background(), byModel, names)
	if !ok {
		t.Fatal("pod m scored neutrally")
	}
	if diff := cmp.Diff([]string{"a100"}, res.Demand.Constraints.Models); diff != "" {
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
	waitFor(t, "claim seen", func() bool { return e.s.dra.PodRequests(mixed) == 2 })
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
	waitFor(t, "claim seen", func() bool { return e.s.dra.PodRequests(pod) == 1 })
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
	waitFor(t, "claim seen", func() bool { return e.s.dra.PodRequests(pod) == 1 })
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

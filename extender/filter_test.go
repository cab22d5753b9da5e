package extender

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

func slicePod(name string, memMiB int64) *corev1.Pod {
	return vgputest.Pod(name).Container("main").GPU(1).MemoryMiB(memMiB).Cores(10).Obj()
}

// TestFilterNotReady puts one node per "plugin not ready" cause beside a
// ready one and checks each message, that all land in
// FailedAndUnresolvableNodes, and that rejections are counted by reason.
func TestFilterNotReady(t *testing.T) {
	inv := func(name string) vgpu.NodeInventory { return vgputest.Node(name).GPU(name+"-GPU-0", 16384).Obj() }
	published := func(name string) *vgputest.NodeObjectBuilder { return vgputest.PublishedNode(inv(name)) }
	fresh := func(name string) *vgputest.LeaseBuilder {
		return vgputest.HeartbeatLease(name, now.Add(-5*time.Second))
	}
	_, badInventory := vgpu.ParseNodeInventory("{")
	_, badHeartbeat := vgpu.ParsePluginHeartbeat(`{"version":1}`)

	tests := []struct {
		name   string
		node   *corev1.Node
		lease  *coordinationv1.Lease // nil: none
		want   string                // "" passes
		reason vgpu.Reason
	}{
		{name: "ready", node: published("ready").Obj(), lease: fresh("ready").Obj()},
		{name: "renewed-max-age-ago", node: published("renewed-max-age-ago").Obj(),
			lease: vgputest.HeartbeatLease("renewed-max-age-ago", now.Add(-DefaultHeartbeatMaxAge)).Obj()},
		{name: "no-inventory", node: published("no-inventory").WithoutAnnotation(vgpu.AnnotationNodeInventory).Obj(), lease: fresh("no-inventory").Obj(),
			want: "plugin not ready: no hami.io/node-gpu-inventory annotation on the node", reason: ReasonNoInventory},
		{name: "bad-inventory", node: published("bad-inventory").Annotation(vgpu.AnnotationNodeInventory, "{").Obj(), lease: fresh("bad-inventory").Obj(),
			want: "plugin not ready: " + badInventory.Error(), reason: ReasonMalformedInventory},
		{name: "foreign-inventory", node: published("foreign-inventory").Inventory(inv("elsewhere")).Obj(), lease: fresh("foreign-inventory").Obj(),
			want: `plugin not ready: hami.io/node-gpu-inventory names node "elsewhere"`, reason: ReasonMalformedInventory},
		{name: "no-label", node: published("no-label").WithoutLabel(vgpu.LabelGPUReady).Obj(), lease: fresh("no-label").Obj(),
			want: "plugin not ready: label hami.io/gpu.ready is missing", reason: ReasonReadyLabel},
		{name: "label-false", node: published("label-false").Ready(false).Obj(), lease: fresh("label-false").Obj(),
			want: `plugin not ready: label hami.io/gpu.ready is "false"`, reason: ReasonReadyLabel},
		{name: "label-yes", node: published("label-yes").Label(vgpu.LabelGPUReady, "yes").Obj(), lease: fresh("label-yes").Obj(),
			want: `plugin not ready: label hami.io/gpu.ready is "yes" (must be "true" or "false")`, reason: ReasonReadyLabel},
		{name: "no-allocatable", node: vgputest.NodeObject("no-allocatable").Inventory(inv("no-allocatable")).Ready(true).Obj(), lease: fresh("no-allocatable").Obj(),
			want: "plugin not ready: allocatable hami.io/gpu is 0", reason: ReasonNoAllocatable},
		{name: "zero-allocatable", node: published("zero-allocatable").Allocatable(vgpu.ResourceGPU, 0).Obj(), lease: fresh("zero-allocatable").Obj(),
			want: "plugin not ready: allocatable hami.io/gpu is 0", reason: ReasonNoAllocatable},
		{name: "no-lease", node: published("no-lease").Obj(),
			want: "plugin not ready: no heartbeat Lease in namespace kube-node-lease", reason: ReasonNoHeartbeat},
		{name: "lease-elsewhere", node: published("lease-elsewhere").Obj(), lease: fresh("lease-elsewhere").Namespace("default").Obj(),
			want: "plugin not ready: no heartbeat Lease in namespace kube-node-lease", reason: ReasonNoHeartbeat},
		{name: "no-renew-time", node: published("no-renew-time").Obj(), lease: fresh("no-renew-time").RenewedAt(time.Time{}).Obj(),
			want: "plugin not ready: heartbeat Lease has no renewTime", reason: ReasonNoHeartbeat},
		{name: "stale", node: published("stale").Obj(), lease: vgputest.HeartbeatLease("stale", now.Add(-DefaultHeartbeatMaxAge-time.Second)).Obj(),
			want: "plugin not ready: heartbeat Lease not renewed for more than 1m0s", reason: ReasonStaleHeartbeat},
		{name: "not-registered", node: published("not-registered").Obj(),
			lease: fresh("not-registered").Heartbeat(vgpu.PluginHeartbeat{Node: "not-registered", ResourceName: string(vgpu.ResourceGPU)}).Obj(),
			want:  "plugin not ready: heartbeat says the device plugin is not registered with the kubelet", reason: ReasonNotRegistered},
		{name: "bad-heartbeat", node: published("bad-heartbeat").Obj(), lease: fresh("bad-heartbeat").Annotation(vgpu.AnnotationPluginHeartbeat, `{"version":1}`).Obj(),
			want: "plugin not ready: " + badHeartbeat.Error(), reason: ReasonNotRegistered},
	}
	var objs []runtime.Object
	names := []string{"ghost"}
	want := extenderv1.ExtenderFilterResult{
		NodeNames:                  &[]string{},
		FailedNodes:                extenderv1.FailedNodesMap{"ghost": "node not in gpuslice-scheduler's cache yet"},
		FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{},
	}
	wantCounts := map[vgpu.Reason]int64{ReasonNodeUnknown: 1}
	for _, tt := range tests {
		objs = append(objs, tt.node)
		if tt.lease != nil {
			objs = append(objs, tt.lease)
		}
		names = append(names, tt.name)
		if tt.want == "" {
			*want.NodeNames = append(*want.NodeNames, tt.name)
		} else {
			want.FailedAndUnresolvableNodes[tt.name] = tt.want
			wantCounts[tt.reason]++
		}
	}
	e := newEnv(t, testConfig(), objs...)
	got := e.filter(slicePod("p", 1024), names...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("filter (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantCounts, e.s.Rejections()); diff != "" {
		t.Errorf("Rejections (-want +got):\n%s", diff)
	}
}

// TestFilterFollowsUpdates checks that label, Lease and clock changes reach
// Filter through the informers.
func TestFilterFollowsUpdates(t *testing.T) {
	_, n1 := gpuNode("n1", 1, 16384)
	e := newEnv(t, testConfig(), n1...)
	ctx := context.Background()
	pod := slicePod("p", 1024)
	passes := func() bool { return len(*e.filter(pod, "n1").NodeNames) == 1 }
	if !passes() {
		t.Fatal("n1 does not pass at start")
	}

	node := n1[0].(*corev1.Node).DeepCopy()
	node.Labels[vgpu.LabelGPUReady] = "false"
	if _, err := e.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n1 rejected after its label turned false", func() bool { return !passes() })
	node.Labels[vgpu.LabelGPUReady] = "true"
	if _, err := e.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n1 accepted after its label turned true", passes)

	e.clock.SetTime(now.Add(2 * time.Minute))
	if got := e.filter(pod, "n1").FailedAndUnresolvableNodes["n1"]; got != "plugin not ready: heartbeat Lease not renewed for more than 1m0s" {
		t.Errorf("after 2 minutes without renewal: %q", got)
	}
	lease := vgputest.HeartbeatLease("n1", now.Add(2*time.Minute)).Obj()
	if _, err := e.client.CoordinationV1().Leases(lease.Namespace).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n1 accepted after its Lease was renewed", passes)

	if err := e.client.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n1 unknown after deletion", func() bool {
		return e.filter(pod, "n1").FailedNodes["n1"] == "node not in gpuslice-scheduler's cache yet"
	})
}

// fitMessage is vgpu.Fit's own message for pod on inv with usage.
func fitMessage(t *testing.T, pod *corev1.Pod, inv *vgpu.NodeInventory, usage *vgpu.NodeUsage) string {
	t.Helper()
	d, err := cluster.DemandOf(pod)
	if err != nil {
		t.Fatal(err)
	}
	_, err = vgpu.Fit(d.Pod, vgpu.NodeState{Inventory: *inv, Usage: usage}, vgpu.FitOptions{})
	var fe *vgpu.FitError
	if !errors.As(err, &fe) {
		t.Fatalf("Fit: %v, want a *vgpu.FitError", err)
	}
	return fe.Message
}

// needMessage returns vgpu.NeedMessage for the reason pod does not fit inv
// holding usage: what Filter answers for that node.
func needMessage(t *testing.T, pod *corev1.Pod, inv *vgpu.NodeInventory, usage *vgpu.NodeUsage) string {
	t.Helper()
	d, err := cluster.DemandOf(pod)
	if err != nil {
		t.Fatal(err)
	}
	_, err = vgpu.Fit(d.Pod, vgpu.NodeState{Inventory: *inv, Usage: usage}, vgpu.FitOptions{ReasonOnly: true})
	var fe *vgpu.FitError
	if !errors.As(err, &fe) {
		t.Fatalf("Fit: %v, want a *vgpu.FitError", err)
	}
	return vgpu.NeedMessage(d.Pod, fe)
}

// TestFilterFitRejection checks that the reason vgpu.Fit finds reaches the
// answer as vgpu.NeedMessage (equal on every node that fails alike),
// in FailedNodes for capacity and FailedAndUnresolvableNodes for a model
// mismatch, and that a pod's own usage does not count against it.
func TestFilterFitRejection(t *testing.T) {
	full, fullObjs := gpuNode("full", 1, 16384)
	_, freeObjs := gpuNode("free", 1, 16384)
	holder := vgputest.Allocation("full").Container("main").Slice("full-GPU-0", 12000, 10).Obj()
	held := boundPod(vgputest.Pod("holder").Container("main").GPU(1).MemoryMiB(12000).Cores(10), holder)
	e := newEnv(t, testConfig(), objects(fullObjs, freeObjs, []runtime.Object{held})...)
	waitFor(t, "holder counted", func() bool { return e.s.NodeUsage("full").GPU("full-GPU-0").MemoryMiB == 12000 })

	pod := slicePod("p", 8192)
	want := extenderv1.ExtenderFilterResult{
		NodeNames:                  &[]string{"free"},
		FailedNodes:                extenderv1.FailedNodesMap{"full": needMessage(t, pod, full, vgputest.Usage(holder))},
		FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{},
	}
	if diff := cmp.Diff(want, e.filter(pod, "full", "free")); diff != "" {
		t.Errorf("capacity (-want +got):\n%s", diff)
	}

	h100 := vgputest.Pod("h100").Annotation(vgpu.AnnotationGPUModel, "H100").Container("main").GPU(1).MemoryMiB(1024).Obj()
	got := e.filter(h100, "full", "free")
	if diff := cmp.Diff([]string{"free", "full"}, slices.Sorted(maps.Keys(got.FailedAndUnresolvableNodes))); diff != "" {
		t.Errorf("model mismatch: unresolvable nodes (-want +got):\n%s\n%+v", diff, got)
	}

	// The holder itself, filtered again, fits where it is counted.
	again := held.DeepCopy()
	again.Spec.NodeName = ""
	if diff := cmp.Diff([]string{"full", "free"}, *e.filter(again, "full", "free").NodeNames); diff != "" {
		t.Errorf("own usage counted against the pod (-want +got):\n%s", diff)
	}
}

// TestFilterResult checks which fitting nodes Filter passes: with
// FilterResultBest only the nodes of the best score under the node policy
// (every node that ties it, in input order; scores compared as
// vgpu.NodeScore.Compare does, Value then Raw, so a node of the best Value
// but a lower Raw is left out), with FilterResultFeasible all of them;
// nodes left out are not failed, and failed nodes are failed alike in both.
func TestFilterResult(t *testing.T) {
	_, a := gpuNode("a", 1, 16384)
	_, b := gpuNode("b", 1, 16384)
	_, c := gpuNode("c", 1, 16384)
	full, d := gpuNode("d", 1, 16384)
	_, eObjs := gpuNode("e", 1, 16384)
	_, fObjs := gpuNode("f", 1, 16384)
	_, gObjs := gpuNode("g", 1, 16384)
	_, hObjs := gpuNode("h", 1, 16384)
	onC := vgputest.Allocation("c").Container("main").Slice("c-GPU-0", 4915, 0).Obj()
	onD := vgputest.Allocation("d").Container("main").Slice("d-GPU-0", 16000, 0).Obj()
	onE := vgputest.Allocation("e").Container("main").Slice("e-GPU-0", 4915, 0).Obj()
	onF := vgputest.Allocation("f").Container("main").Slice("f-GPU-0", 4260, 0).Obj()
	onG := vgputest.Allocation("g").Container("main").Slice("g-GPU-0", 4960, 0).Obj()
	onH := vgputest.Allocation("h").Container("main").Slice("h-GPU-0", 4960, 0).Obj()
	objs := objects(a, b, c, d, eObjs, fObjs, gObjs, hObjs, []runtime.Object{
		boundPod(vgputest.Pod("on-c").Container("main").GPU(1).MemoryMiB(4915), onC),
		boundPod(vgputest.Pod("on-d").Container("main").GPU(1).MemoryMiB(16000), onD),
		boundPod(vgputest.Pod("on-e").Container("main").GPU(1).MemoryMiB(4915), onE),
		boundPod(vgputest.Pod("on-f").Container("main").GPU(1).MemoryMiB(4260), onF),
		boundPod(vgputest.Pod("on-g").Container("main").GPU(1).MemoryMiB(4960), onG),
		boundPod(vgputest.Pod("on-h").Container("main").GPU(1).MemoryMiB(4960), onH),
	})
	pod := slicePod("p", 8192)
	for _, tc := range []struct {
		result FilterResult
		policy vgpu.Policy
		want   []string
	}{
		// g and h are 80.27% used after the pod, both: Value 80. c and
		// e are 79.99% used, also Value 80 but a lower Raw; f 76%,
		// which Prioritize's 0..10 puts in their tier (8 of 10).
		{FilterResultBest, vgpu.PolicyBinpack, []string{"g", "h"}},
		{FilterResultBest, vgpu.PolicySpread, []string{"b", "a"}},
		{FilterResultFeasible, vgpu.PolicyBinpack, []string{"b", "c", "e", "g", "h", "f", "a"}},
		{FilterResultFeasible, vgpu.PolicySpread, []string{"b", "c", "e", "g", "h", "f", "a"}},
	} {
		t.Run(string(tc.result)+"/"+string(tc.policy), func(t *testing.T) {
			cfg := testConfig()
			cfg.FilterResult, cfg.NodePolicy = tc.result, tc.policy
			e := newEnv(t, cfg, objs...)
			waitFor(t, "bound pods counted", func() bool {
				return e.s.NodeUsage("c").GPU("c-GPU-0").MemoryMiB == 4915 && e.s.NodeUsage("d").GPU("d-GPU-0").MemoryMiB == 16000 &&
					e.s.NodeUsage("e").GPU("e-GPU-0").MemoryMiB == 4915 && e.s.NodeUsage("f").GPU("f-GPU-0").MemoryMiB == 4260 &&
					e.s.NodeUsage("g").GPU("g-GPU-0").MemoryMiB == 4960 && e.s.NodeUsage("h").GPU("h-GPU-0").MemoryMiB == 4960
			})
			want := extenderv1.ExtenderFilterResult{
				NodeNames:                  &tc.want,
				FailedNodes:                extenderv1.FailedNodesMap{"d": needMessage(t, pod, full, vgputest.Usage(onD))},
				FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{},
			}
			if diff := cmp.Diff(want, e.filter(pod, "b", "c", "d", "e", "g", "h", "f", "a")); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestFilterModes checks that nodeCacheCapable (NodeNames) and full Node
// lists get the same decision, each in its own form, in input order.
func TestFilterModes(t *testing.T) {
	_, a := gpuNode("a", 1, 16384)
	_, b := gpuNode("b", 1, 16384)
	notReady := vgputest.NodeObject("c").Obj()
	e := newEnv(t, testConfig(), objects(a, b, []runtime.Object{notReady})...)
	pod := slicePod("p", 1024)

	byName := e.filter(pod, "b", "c", "a")
	if diff := cmp.Diff(&[]string{"b", "a"}, byName.NodeNames); diff != "" {
		t.Errorf("NodeNames (-want +got):\n%s", diff)
	}
	if byName.Nodes != nil {
		t.Errorf("Nodes set in nodeCacheCapable mode: %v", byName.Nodes)
	}

	list := &corev1.NodeList{Items: []corev1.Node{*b[0].(*corev1.Node), *notReady, *a[0].(*corev1.Node)}}
	var full extenderv1.ExtenderFilterResult
	if code, body := e.post("/filter", extenderv1.ExtenderArgs{Pod: pod, Nodes: list}, &full); code != 200 {
		t.Fatalf("HTTP %d: %s", code, body)
	}
	if full.NodeNames != nil {
		t.Errorf("NodeNames set in full-node mode: %v", *full.NodeNames)
	}
	var got []string
	for _, n := range full.Nodes.Items {
		got = append(got, n.Name)
	}
	if diff := cmp.Diff([]string{"b", "a"}, got); diff != "" {
		t.Errorf("Nodes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(*b[0].(*corev1.Node), full.Nodes.Items[0]); diff != "" {
		t.Errorf("returned Node differs from the one sent (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(byName.FailedAndUnresolvableNodes, full.FailedAndUnresolvableNodes); diff != "" {
		t.Errorf("failures differ between modes (-names +full):\n%s", diff)
	}
}

// TestFilterPodErrors checks that an invalid request or annotation fails
// the whole call with Error naming it, and that a pod without GPUs passes
// every node.
func TestFilterPodErrors(t *testing.T) {
	_, a := gpuNode("a", 1, 16384)
	e := newEnv(t, testConfig(), append(a, vgputest.NodeObject("c").Obj())...)
	tests := []struct {
		name string
		pod  *corev1.Pod
		want extenderv1.ExtenderFilterResult
	}{{
		name: "cores above 100",
		pod:  vgputest.Pod("p").Container("main").GPU(1).Cores(150).Obj(),
		want: extenderv1.ExtenderFilterResult{
			FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{},
			Error: `pod default/p: invalid GPU request: container "main": hami.io/gpucores=150: must be an integer from 1 to 100`,
		},
	}, {
		name: "bad policy annotation",
		pod:  vgputest.Pod("p").Annotation(vgpu.AnnotationGPUPolicy, "pack").Container("main").GPU(1).Obj(),
		want: extenderv1.ExtenderFilterResult{
			FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{},
			Error: `pod default/p: invalid placement annotation: hami.io/gpu-policy="pack": must be one of binpack, spread, fragmentation`,
		},
	}, {
		name: "no GPU",
		pod:  vgputest.Pod("p").Container("main").Obj(),
		want: extenderv1.ExtenderFilterResult{
			NodeNames:   &[]string{"a", "c"},
			FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, e.filter(tt.pod, "a", "c")); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestFilterEnforcement: a pod that requires enforcement passes only the
// nodes whose published mechanism guards it; the others fail with the
// need, as unresolvable (evicting pods cannot add a mechanism).
func TestFilterEnforcement(t *testing.T) {
	guarded := vgputest.Node("guarded").GPU("guarded-GPU-0", 16384).Enforcement(vgpu.EnforcementDriver).Obj()
	bare := vgputest.Node("bare").GPU("bare-GPU-0", 16384).Enforcement(vgpu.EnforcementNone).Obj()
	var objs []runtime.Object
	for _, inv := range []vgpu.NodeInventory{guarded, bare} {
		objs = append(objs, vgputest.PublishedNode(inv).Obj(), vgputest.HeartbeatLease(inv.Node, now.Add(-5*time.Second)).Obj())
	}
	e := newEnv(t, testConfig(), objs...)

	pod := vgputest.Pod("p").Annotation(vgpu.AnnotationEnforcement, "required").Container("main").GPU(1).MemoryMiB(1024).Obj()
	want := extenderv1.ExtenderFilterResult{
		NodeNames:                  &[]string{"guarded"},
		FailedNodes:                extenderv1.FailedNodesMap{},
		FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{"bare": "GPU limits not enforced: hami.io/enforcement=required needs a mechanism that guards on 1 GPU"},
	}
	if diff := cmp.Diff(want, e.filter(pod, "guarded", "bare")); diff != "" {
		t.Errorf("filter (-want +got):\n%s", diff)
	}
	plain := vgputest.Pod("q").Container("main").GPU(1).MemoryMiB(1024).Obj()
	if diff := cmp.Diff([]string{"guarded", "bare"}, *e.filter(plain, "guarded", "bare").NodeNames); diff != "" {
		t.Errorf("a pod without the requirement (-want +got):\n%s", diff)
	}
}

package extender

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

// TestRestart checks that a Scheduler started afresh counts exactly what
// the pods' annotations say, after binds, a deletion and a pod that ended.
func TestRestart(t *testing.T) {
	inv, n1 := gpuNode("n1", 2, 16384)
	var pods []runtime.Object
	for i := range 6 {
		pods = append(pods, vgputest.Pod(string(rune('a'+i))).Container("main").GPU(1).MemoryMiB(2048).Cores(10).Obj())
	}
	e := newEnv(t, testConfig(), objects(n1, pods)...)
	for _, p := range pods {
		if r := e.bind(p.(*corev1.Pod), "n1"); r.Error != "" {
			t.Fatalf("bind: %s", r.Error)
		}
	}
	e.settled()
	ctx := t.Context()
	if err := e.client.CoreV1().Pods("default").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	done := e.getPod(pods[1].(*corev1.Pod))
	done.Status.Phase = corev1.PodSucceeded
	if _, err := e.client.CoreV1().Pods("default").UpdateStatus(ctx, done, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Four pods of 2048 MiB and 10% remain, placed by binpack on GPU-0.
	want := map[string]vgpu.GPUUsage{"n1-GPU-0": {MemoryMiB: 4 * 2048, CoresPercent: 40, Slices: 4}}
	waitFor(t, "deletion and completion counted", func() bool { return cmp.Equal(want, usageTable(e.s, inv)) })

	restarted := startEnv(t, testConfig(), e.client)
	if diff := cmp.Diff(want, usageTable(restarted.s, inv)); diff != "" {
		t.Errorf("after restart (-want +got):\n%s", diff)
	}
}

// TestTrim checks that the trimmed pod the informer keeps reads the same
// request, constraints and allocation as the full pod.
// TestPodHandlersMetadataOnly checks that a pod's update to one the trimmer
// keeps as metadata only (its hami.io/ annotations removed) stops counting it,
// and that such pods are deleted without effect.
func TestPodHandlersMetadataOnly(t *testing.T) {
	st := testState()
	h := podHandlers(klog.Background(), st, nil)
	trim := trimmer(vgpu.ResourceGPU, nil)
	alloc := vgputest.Allocation("n1").Container("main").Slice("n1-GPU-0", 2000, 0).Obj()
	counted := boundPod(vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(2000), alloc)
	bare := counted.DeepCopy()
	bare.Annotations = nil
	bare.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	add := func(p *corev1.Pod) any {
		obj, err := trim(p)
		if err != nil {
			t.Fatal(err)
		}
		return obj
	}
	h.OnAdd(add(counted), false)
	if got := st.Usage("n1").GPU("n1-GPU-0").MemoryMiB; got != 2000 {
		t.Fatalf("counted pod: %d MiB used, want 2000", got)
	}
	meta := add(bare)
	if _, ok := meta.(*podMeta); !ok {
		t.Fatalf("trimmed bare pod is a %T, want metadata only", meta)
	}
	h.OnUpdate(add(counted), meta)
	if got := st.Usage("n1").GPU("n1-GPU-0").MemoryMiB; got != 0 {
		t.Errorf("after the update to metadata only: %d MiB used, want 0", got)
	}
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "default/p", Obj: meta})
	if pods, hosts := st.Counted(); pods != 0 || hosts != 0 {
		t.Errorf("after the tombstone: %d pods and %d host entries counted, want none", pods, hosts)
	}
}

// TestPodHandlersRecreatedUnderSameName checks the update an informer
// delivers when it lists again after a watch gap in which a pod was deleted
// and created again under the same name: from the old pod to the new one,
// with no delete of the old one. Only the new pod's slice may count.
func TestPodHandlersRecreatedUnderSameName(t *testing.T) {
	st := testState()
	h := podHandlers(klog.Background(), st, nil)
	trim := trimmer(vgpu.ResourceGPU, nil)
	add := func(p *corev1.Pod) any {
		obj, err := trim(p)
		if err != nil {
			t.Fatal(err)
		}
		return obj
	}
	old := boundPod(vgputest.Pod("web-0").Container("main").GPU(1).MemoryMiB(2000),
		vgputest.Allocation("n1").Container("main").Slice("n1-GPU-0", 2000, 0).Obj())
	old.UID = "uid-old"
	recreated := boundPod(vgputest.Pod("web-0").Container("main").GPU(1).MemoryMiB(1000),
		vgputest.Allocation("n1").Container("main").Slice("n1-GPU-0", 1000, 0).Obj())
	recreated.UID = "uid-new"

	h.OnAdd(add(old), false)
	h.OnUpdate(add(old), add(recreated))
	if diff := cmp.Diff(vgpu.GPUUsage{MemoryMiB: 1000, Slices: 1}, st.Usage("n1").GPU("n1-GPU-0")); diff != "" {
		t.Errorf("usage after the old pod was replaced by the new one (-want +got):\n%s", diff)
	}
	h.OnDelete(add(recreated))
	if pods, _ := st.Counted(); pods != 0 {
		t.Errorf("after the new pod's delete: %d pods counted, want none", pods)
	}
}

func TestTrim(t *testing.T) {
	alloc := vgputest.Allocation("n1").InitContainer("side").Slice("n1-GPU-0", 1000, 0).Container("main").Slice("n1-GPU-0", 2000, 10).Obj()
	pod := boundPod(vgputest.Pod("p").Annotation(vgpu.AnnotationGPUModel, "A100").
		Sidecar("side").GPU(1).MemoryMiB(1000).
		Container("main").GPU(1).MemoryMiB(2000).Cores(10), alloc)
	pod.Labels = map[string]string{"app": "x"}
	pod.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "b"}}
	pod.Status.Phase = corev1.PodRunning
	trim := trimmer(vgpu.ResourceGPU, nil)
	obj, err := trim(pod)
	if err != nil {
		t.Fatal(err)
	}
	kept, ok := obj.(*gpuPod)
	if !ok {
		t.Fatalf("trimmed GPU pod is a %T, want a *gpuPod", obj)
	}
	trimmed := kept.pod()
	want, _ := cluster.DemandOf(pod)
	got, _ := cluster.DemandOf(trimmed)
	if diff := cmp.Diff(want.Pod, got.Pod); diff != "" || want.UID != got.UID {
		t.Errorf("demand (-full +trimmed):\n%s", diff)
	}
	if trimmed.UID != pod.UID || trimmed.Spec.NodeName != "n1" || trimmed.Status.Phase != corev1.PodRunning ||
		trimmed.Annotations[vgpu.AnnotationPodAllocation] != pod.Annotations[vgpu.AnnotationPodAllocation] {
		t.Errorf("trimmed pod lost what the extender reads: %+v", trimmed)
	}
	if trimmed.Labels != nil || trimmed.Spec.Containers[0].Env != nil || len(trimmed.Annotations) != 2 {
		t.Errorf("trimmed pod kept labels, env or annotations other than hami.io/: %+v", trimmed)
	}
	// The store keys it and reads its identity as it does a Pod's, and a
	// deep copy shares nothing with it.
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err != nil || key != pod.Namespace+"/"+pod.Name {
		t.Errorf("store key of the trimmed GPU pod = %q, %v; want %q", key, err, pod.Namespace+"/"+pod.Name)
	}
	if m, err := meta.Accessor(obj); err != nil || m.GetUID() != pod.UID || m.GetAnnotations()[vgpu.AnnotationPodAllocation] == "" {
		t.Errorf("meta.Accessor of the trimmed GPU pod: %v, %v", m, err)
	}
	cp := kept.DeepCopyObject().(*gpuPod)
	if diff := cmp.Diff(kept, cp); diff != "" {
		t.Errorf("deep copy (-kept +copy):\n%s", diff)
	}
	cp.Annotations[vgpu.AnnotationPodAllocation] = "changed"
	cp.Containers[0].Resources.Limits[vgpu.ResourceGPU] = resource.MustParse("7")
	if kept.Annotations[vgpu.AnnotationPodAllocation] == "changed" || kept.Containers[0].Resources.Limits.Name(vgpu.ResourceGPU, resource.DecimalSI).Value() == 7 {
		t.Error("a change to the deep copy changed the cached pod")
	}

	// A pod that asks for no GPU is kept as its identity, node and host request only.
	plain := vgputest.Pod("plain").Container("main").Limit(corev1.ResourceCPU, "2").Obj()
	plain.Spec.NodeName = "n1"
	plain.Labels = map[string]string{"app": "x"}
	plain.ResourceVersion = "7"
	obj, err = trim(plain)
	if err != nil {
		t.Fatal(err)
	}
	wantMeta := &podMeta{
		Name: plain.Name, Namespace: plain.Namespace, UID: plain.UID, ResourceVersion: "7",
		NodeName: "n1",
		Host:     vgpu.HostResources{CPUMilli: 2000},
	}
	if diff := cmp.Diff(wantMeta, obj); diff != "" {
		t.Errorf("trimmed plain pod (-want +got):\n%s", diff)
	}
	// The informer's store keys it and reads its identity as it does a Pod's.
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err != nil || key != plain.Namespace+"/"+plain.Name {
		t.Errorf("store key of the trimmed plain pod = %q, %v; want %q", key, err, plain.Namespace+"/"+plain.Name)
	}
	if m, err := meta.Accessor(obj); err != nil || m.GetUID() != plain.UID || m.GetResourceVersion() != "7" {
		t.Errorf("meta.Accessor of the trimmed plain pod: %v, %v", m, err)
	}

	inv := vgputest.Node("n1").GPU("n1-GPU-0", 16384).Obj()
	node := vgputest.PublishedNode(inv).Obj()
	node.Labels["kubernetes.io/hostname"] = "n1"
	node.Annotations["node.alpha.kubernetes.io/ttl"] = "0"
	node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("8")
	node.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.example/app:1"}, SizeBytes: 1 << 30}}
	node.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
		{Type: vgpu.ConditionRegistered, Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered, Message: "registered"},
	}
	obj, err = trim(node)
	if err != nil {
		t.Fatal(err)
	}
	full, small := testState(), testState()
	full.UpsertNode(node)
	small.UpsertNodeMeta(obj.(*cluster.NodeMeta))
	f, _ := full.Node("n1")
	sm, _ := small.Node("n1")
	if diff := cmp.Diff(f.Inventory, sm.Inventory); diff != "" {
		t.Errorf("inventory (-full +trimmed):\n%s", diff)
	}
	if f.Known != sm.Known || f.InventoryHash != sm.InventoryHash || !sm.HasInventory || f.InventoryErr != nil || sm.InventoryErr != nil ||
		!f.Readiness.Ready() || !sm.Readiness.Ready() || !cmp.Equal(f.HostAllocatable, sm.HostAllocatable) || sm.HostAllocatable == nil ||
		!cmp.Equal(f.Registered, sm.Registered) || sm.Registered == nil || f.KubeletReady != sm.KubeletReady || !sm.KubeletReady {
		t.Errorf("node state: full %+v, trimmed %+v; want both known, ready and equal", f, sm)
	}
	// The Node cache keeps the parse, not the annotation, and of the
	// registration condition its status and reason only.
	trimmedNode := obj.(*cluster.NodeMeta)
	if trimmedNode.Registered == nil || trimmedNode.Registered.Message != "" || !trimmedNode.KubeletReady ||
		trimmedNode.ReadyLabel != "true" || !trimmedNode.HasInventory || trimmedNode.InventoryErr != nil || len(trimmedNode.Inventory.GPUs) == 0 {
		t.Errorf("trimmed node: %+v", trimmedNode)
	}

	// A heartbeat Lease keeps its renewal and heartbeat annotation: the
	// state reads the same from it.
	lease := vgputest.HeartbeatLease("n1", now).Obj()
	lease.Spec.HolderIdentity = ptr.To("gpuslice-device-plugin-abcde")
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](40)
	obj, err = trim(lease)
	if err != nil {
		t.Fatal(err)
	}
	trimmedLease := obj.(*coordinationv1.Lease)
	if !trimmedLease.Spec.RenewTime.Equal(lease.Spec.RenewTime) || trimmedLease.Name != lease.Name ||
		trimmedLease.Annotations[vgpu.AnnotationPluginHeartbeat] != lease.Annotations[vgpu.AnnotationPluginHeartbeat] ||
		trimmedLease.Spec.HolderIdentity != nil || trimmedLease.Labels != nil {
		t.Errorf("trimmed Lease %+v, from %+v: want its name, renewTime and heartbeat annotation only", trimmedLease, lease)
	}
}

// testState is an empty state as the Scheduler makes it, on the fixed
// test time.
func testState() *cluster.State {
	return cluster.New(cluster.Options{
		ResourceName: vgpu.ResourceGPU, Now: func() time.Time { return now }, HeartbeatMaxAge: DefaultHeartbeatMaxAge,
		HeartbeatNamespace: "gpuslice-system", Workload: vgpu.DefaultWorkload(),
	})
}

// TestHostFree checks the CPU and memory the summaries are given: the
// Node's allocatable less what its bound, running pods request, GPU pods or
// not, through the informer's trimmed objects.
func TestHostFree(t *testing.T) {
	st := testState()
	h := podHandlers(klog.Background(), st, nil)
	trim := trimmer(vgpu.ResourceGPU, nil)
	obj := func(o runtime.Object) any {
		t.Helper()
		out, err := trim(o)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	node := vgputest.PublishedNode(vgputest.Node("n1").GPU("n1-GPU-0", 16384).Obj()).Obj()
	node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("8")
	node.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("32Gi")
	st.UpsertNodeMeta(obj(node).(*cluster.NodeMeta))
	free := func() *vgpu.HostResources {
		n, _ := st.Node("n1")
		return n.HostFree
	}
	plain := vgputest.Pod("plain").Container("main").Limit(corev1.ResourceCPU, "2").Limit(corev1.ResourceMemory, "4Gi").Obj()
	pending := plain.DeepCopy()
	h.OnAdd(obj(pending), false)
	plain.Spec.NodeName = "n1"
	h.OnUpdate(obj(pending), obj(plain))
	alloc := vgputest.Allocation("n1").Container("main").Slice("n1-GPU-0", 2000, 0).Obj()
	gpu := boundPod(vgputest.Pod("gpu").Container("main").GPU(1).MemoryMiB(2000).Limit(corev1.ResourceCPU, "1"), alloc)
	h.OnAdd(obj(gpu), false)
	if diff := cmp.Diff(&vgpu.HostResources{CPUMilli: 5000, MemoryMiB: 28 << 10}, free()); diff != "" {
		t.Errorf("two pods bound (-want +got):\n%s", diff)
	}
	done := plain.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	h.OnUpdate(obj(plain), obj(done))
	h.OnDelete(obj(gpu))
	if diff := cmp.Diff(&vgpu.HostResources{CPUMilli: 8000, MemoryMiB: 32 << 10}, free()); diff != "" {
		t.Errorf("one finished, one deleted (-want +got):\n%s", diff)
	}
	// Pods kept as a podMeta are deleted by their identity too, tombstones
	// included.
	for i, wrap := range []func(any) any{func(o any) any { return o }, func(o any) any { return cache.DeletedFinalStateUnknown{Key: "default/x", Obj: o} }} {
		p := plain.DeepCopy()
		p.Name, p.UID = fmt.Sprintf("plain-%d", i), types.UID(fmt.Sprintf("uid-plain-%d", i))
		h.OnAdd(obj(p), false)
		h.OnDelete(wrap(obj(p)))
	}
	if diff := cmp.Diff(&vgpu.HostResources{CPUMilli: 8000, MemoryMiB: 32 << 10}, free()); diff != "" {
		t.Errorf("plain pods added and deleted (-want +got):\n%s", diff)
	}
}

// TestNodeInventoryParsedOnce checks that the Node cache shares the parse
// the state holds while the inventory annotation does not change, parses
// again when it does, and turns away a node whose new inventory names
// another node.
func TestNodeInventoryParsedOnce(t *testing.T) {
	st := testState()
	trim := trimmer(vgpu.ResourceGPU, st.ParsedInventory)
	meta := func(n *corev1.Node) *cluster.NodeMeta {
		t.Helper()
		out, err := trim(n)
		if err != nil {
			t.Fatal(err)
		}
		return out.(*cluster.NodeMeta)
	}
	node := vgputest.PublishedNode(vgputest.Node("n1").GPU("n1-GPU-0", 16384).GPU("n1-GPU-1", 16384).Obj()).Obj()
	first := meta(node)
	st.UpsertNodeMeta(first)
	n1, _ := st.Node("n1")
	gen := n1.Gen

	// A status update that leaves the annotation alone: the same parse,
	// and no new summary.
	again := node.DeepCopy()
	again.ResourceVersion = "2"
	second := meta(again)
	if &second.Inventory.GPUs[0] != &first.Inventory.GPUs[0] {
		t.Error("the inventory was parsed again though its annotation did not change")
	}
	st.UpsertNodeMeta(second)
	if n, _ := st.Node("n1"); n.Gen != gen || len(n.Inventory.GPUs) != 2 {
		t.Errorf("unchanged inventory: generation %d (was %d), %d GPUs", n.Gen, gen, len(n.Inventory.GPUs))
	}

	// A new inventory is parsed and counted.
	grown := vgputest.PublishedNode(vgputest.Node("n1").GPU("n1-GPU-0", 16384).GPU("n1-GPU-1", 16384).GPU("n1-GPU-2", 16384).Obj()).Obj()
	st.UpsertNodeMeta(meta(grown))
	if n, _ := st.Node("n1"); len(n.Inventory.GPUs) != 3 || n.Gen == gen || !n.Readiness.Ready() {
		t.Errorf("changed inventory: %d GPUs, generation %d (was %d), readiness %+v", len(n.Inventory.GPUs), n.Gen, gen, n.Readiness)
	}

	// An inventory that names another node turns the node away.
	other := vgputest.PublishedNode(vgputest.Node("n2").GPU("n2-GPU-0", 16384).Obj()).Obj()
	wrong := grown.DeepCopy()
	wrong.Annotations[vgpu.AnnotationNodeInventory] = other.Annotations[vgpu.AnnotationNodeInventory]
	st.UpsertNodeMeta(meta(wrong))
	if n, _ := st.Node("n1"); n.Readiness.Reason != vgpu.ReasonMalformedInventory {
		t.Errorf("inventory of n2 on n1: readiness %+v, want %s", n.Readiness, vgpu.ReasonMalformedInventory)
	}
}

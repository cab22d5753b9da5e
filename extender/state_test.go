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
)

// TestUpsertPod checks which pods count, event by event: a slice of
// 1000 MiB on n1-GPU-0 is the pod's allocation throughout.
func TestUpsertPod(t *testing.T) {
	alloc := vgputest.Allocation("n1").Container("main").Slice("n1-GPU-0", 1000, 10).Obj()
	raw, err := vgpu.EncodePodAllocation(alloc)
	if err != nil {
		t.Fatal(err)
	}
	base := vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(1000).Cores(10)
	unbound := base.Obj()
	annotated := vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(1000).Cores(10).Annotation(vgpu.AnnotationPodAllocation, raw).Obj()
	bound := boundPod(vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(1000).Cores(10), alloc)
	succeeded := bound.DeepCopy()
	succeeded.Status.Phase = corev1.PodSucceeded
	elsewhere := bound.DeepCopy()
	elsewhere.Spec.NodeName = "n2"
	malformed := bound.DeepCopy()
	malformed.Annotations[vgpu.AnnotationPodAllocation] = "{"
	noAlloc := bound.DeepCopy()
	delete(noAlloc.Annotations, vgpu.AnnotationPodAllocation)
	slice := vgpu.GPUUsage{MemoryMiB: 1000, CoresPercent: 10, Slices: 1}

	tests := []struct {
		name          string
		reserved      bool // start with Bind's reservation of alloc
		events        []*corev1.Pod
		want          vgpu.GPUUsage
		wantErr       bool
		stillReserved bool // a reservation is still counted at the end
	}{
		{name: "bound pod counts", events: []*corev1.Pod{bound}, want: slice},
		{name: "bound twice counts once", events: []*corev1.Pod{bound, bound}, want: slice},
		{name: "unbound pod with allocation does not count", events: []*corev1.Pod{annotated}},
		{name: "unbound pod without allocation", events: []*corev1.Pod{unbound}},
		{name: "terminal pod stops counting", events: []*corev1.Pod{bound, succeeded}},
		{name: "malformed allocation", events: []*corev1.Pod{malformed}, wantErr: true},
		{name: "allocation for another node", events: []*corev1.Pod{elsewhere}, wantErr: true},
		{name: "allocation removed", events: []*corev1.Pod{bound, noAlloc}},
		{name: "reservation kept while unbound", reserved: true, events: []*corev1.Pod{unbound, annotated}, want: slice, stillReserved: true},
		{name: "reservation confirmed by binding", reserved: true, events: []*corev1.Pod{annotated, bound}, want: slice},
		{name: "reservation replaced by another binder", reserved: true, events: []*corev1.Pod{noAlloc}},
		{name: "reservation dropped when terminal", reserved: true, events: []*corev1.Pod{succeeded}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := testState()
			if tt.reserved {
				st.mu.Lock()
				st.addLocked(&podEntry{uid: unbound.UID, node: "n1", raw: raw, alloc: alloc, req: base.PodRequest(), reserved: true})
				st.mu.Unlock()
			}
			var err error
			for _, p := range tt.events {
				if e := st.upsertPod(p); e != nil {
					err = e
				}
			}
			if (err != nil) != tt.wantErr {
				t.Errorf("error %v, want error %t", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, st.usageOf("n1").GPU("n1-GPU-0")); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
			if got := st.reservations() == 1; got != tt.stillReserved {
				t.Errorf("reservation left %t, want %t", got, tt.stillReserved)
			}
			st.deletePod(unbound.UID)
			if u := st.usageOf("n1").GPU("n1-GPU-0"); u != (vgpu.GPUUsage{}) {
				t.Errorf("usage after delete: %+v", u)
			}
		})
	}
}

// TestRelease checks that releasing a reservation undoes it once, and never
// undoes a confirmed one.
func TestRelease(t *testing.T) {
	alloc := vgputest.Allocation("n1").Container("main").Slice("n1-GPU-0", 1000, 0).Obj()
	raw, _ := vgpu.EncodePodAllocation(alloc)
	st := testState()
	e := &podEntry{uid: "u", node: "n1", raw: raw, alloc: alloc, reserved: true}
	st.mu.Lock()
	st.addLocked(e)
	st.mu.Unlock()
	if !st.release(e) || st.release(e) {
		t.Error("release: want true once, then false")
	}
	confirmed := &podEntry{uid: "uid-p", node: "n1", raw: raw, alloc: alloc, reserved: true}
	st.mu.Lock()
	st.addLocked(confirmed)
	st.mu.Unlock()
	if err := st.upsertPod(boundPod(vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(1000), alloc)); err != nil {
		t.Fatal(err)
	}
	if st.release(confirmed) {
		t.Error("released a reservation the informer had confirmed")
	}
	if got := st.usageOf("n1").GPU("n1-GPU-0").MemoryMiB; got != 1000 {
		t.Errorf("usage %d MiB, want 1000", got)
	}
}

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
	if got := st.usageOf("n1").GPU("n1-GPU-0").MemoryMiB; got != 2000 {
		t.Fatalf("counted pod: %d MiB used, want 2000", got)
	}
	meta := add(bare)
	if _, ok := meta.(*podMeta); !ok {
		t.Fatalf("trimmed bare pod is a %T, want metadata only", meta)
	}
	h.OnUpdate(add(counted), meta)
	if got := st.usageOf("n1").GPU("n1-GPU-0").MemoryMiB; got != 0 {
		t.Errorf("after the update to metadata only: %d MiB used, want 0", got)
	}
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "default/p", Obj: meta})
	if len(st.pods) != 0 || len(st.hosts) != 0 {
		t.Errorf("after the tombstone: %d pods and %d host entries counted, want none", len(st.pods), len(st.hosts))
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
	if diff := cmp.Diff(vgpu.GPUUsage{MemoryMiB: 1000, Slices: 1}, st.usageOf("n1").GPU("n1-GPU-0")); diff != "" {
		t.Errorf("usage after the old pod was replaced by the new one (-want +got):\n%s", diff)
	}
	h.OnDelete(add(recreated))
	if len(st.pods) != 0 {
		t.Errorf("after the new pod's delete: %d pods counted, want none", len(st.pods))
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
	want, _ := demandOf(pod)
	got, _ := demandOf(trimmed)
	if diff := cmp.Diff(want.pod, got.pod); diff != "" || want.uid != got.uid {
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
	full.upsertNode(node)
	small.upsertNodeMeta(obj.(*nodeMeta))
	f, sm := full.nodes["n1"], small.nodes["n1"]
	if diff := cmp.Diff(f.inventory, sm.inventory); diff != "" {
		t.Errorf("inventory (-full +trimmed):\n%s", diff)
	}
	if f.known != sm.known || f.inventoryHash != sm.inventoryHash || !sm.hasInventory || f.inventoryErr != nil || sm.inventoryErr != nil ||
		!f.readiness.Ready() || !sm.readiness.Ready() || !cmp.Equal(f.hostAllocatable, sm.hostAllocatable) || sm.hostAllocatable == nil ||
		!cmp.Equal(f.registered, sm.registered) || sm.registered == nil || f.kubeletReady != sm.kubeletReady || !sm.kubeletReady {
		t.Errorf("node state: full %+v, trimmed %+v; want both known, ready and equal", f, sm)
	}
	// The Node cache keeps the parse, not the annotation, and of the
	// registration condition its status and reason only.
	trimmedNode := obj.(*nodeMeta)
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

// TestUpsertLeaseIgnoresOtherLeases checks that only heartbeat Leases are
// kept: the kubelets' node Leases share the default namespace.
func TestUpsertLeaseIgnoresOtherLeases(t *testing.T) {
	st := testState()
	kubelet := vgputest.HeartbeatLease("n1", now).Obj()
	kubelet.Name = "n1"
	st.upsertLease(kubelet)
	st.upsertLease(vgputest.HeartbeatLease("n2", now).Obj())
	st.deleteLease("n2")
	want := []string{vgpu.HeartbeatLeaseName("n2")}
	var got []string
	for name := range st.leases {
		got = append(got, name)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("leases kept (-want +got):\n%s", diff)
	}
}

// testState is an empty state as New makes it, on the fixed test time.
func testState() *clusterState {
	return newClusterState(vgpu.ResourceGPU, func() time.Time { return now }, DefaultHeartbeatMaxAge, vgpu.DefaultWorkload())
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
	st.upsertNodeMeta(obj(node).(*nodeMeta))
	free := func() *vgpu.HostResources {
		st.mu.RLock()
		defer st.mu.RUnlock()
		return st.nodes["n1"].hostFreeLocked()
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
	trim := trimmer(vgpu.ResourceGPU, st.parsedInventory)
	meta := func(n *corev1.Node) *nodeMeta {
		t.Helper()
		out, err := trim(n)
		if err != nil {
			t.Fatal(err)
		}
		return out.(*nodeMeta)
	}
	node := vgputest.PublishedNode(vgputest.Node("n1").GPU("n1-GPU-0", 16384).GPU("n1-GPU-1", 16384).Obj()).Obj()
	first := meta(node)
	st.upsertNodeMeta(first)
	gen := st.nodes["n1"].gen

	// A status update that leaves the annotation alone: the same parse,
	// and no new summary.
	again := node.DeepCopy()
	again.ResourceVersion = "2"
	second := meta(again)
	if &second.Inventory.GPUs[0] != &first.Inventory.GPUs[0] {
		t.Error("the inventory was parsed again though its annotation did not change")
	}
	st.upsertNodeMeta(second)
	if n := st.nodes["n1"]; n.gen != gen || len(n.inventory.GPUs) != 2 {
		t.Errorf("unchanged inventory: generation %d (was %d), %d GPUs", n.gen, gen, len(n.inventory.GPUs))
	}

	// A new inventory is parsed and counted.
	grown := vgputest.PublishedNode(vgputest.Node("n1").GPU("n1-GPU-0", 16384).GPU("n1-GPU-1", 16384).GPU("n1-GPU-2", 16384).Obj()).Obj()
	st.upsertNodeMeta(meta(grown))
	if n := st.nodes["n1"]; len(n.inventory.GPUs) != 3 || n.gen == gen || !n.readiness.Ready() {
		t.Errorf("changed inventory: %d GPUs, generation %d (was %d), readiness %+v", len(n.inventory.GPUs), n.gen, gen, n.readiness)
	}

	// An inventory that names another node turns the node away.
	other := vgputest.PublishedNode(vgputest.Node("n2").GPU("n2-GPU-0", 16384).Obj()).Obj()
	wrong := grown.DeepCopy()
	wrong.Annotations[vgpu.AnnotationNodeInventory] = other.Annotations[vgpu.AnnotationNodeInventory]
	st.upsertNodeMeta(meta(wrong))
	if n := st.nodes["n1"]; n.readiness.Reason != vgpu.ReasonMalformedInventory {
		t.Errorf("inventory of n2 on n1: readiness %+v, want %s", n.readiness, vgpu.ReasonMalformedInventory)
	}
}

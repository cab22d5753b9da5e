package cluster

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// now is the tests' fixed time.
var now = time.Date(2026, 3, 14, 9, 30, 0, 0, time.UTC)

// testState is an empty state on the fixed test time.
func testState() *State {
	return New(Options{ResourceName: vgpu.ResourceGPU, Now: func() time.Time { return now }, HeartbeatMaxAge: time.Minute, Workload: vgpu.DefaultWorkload()})
}

// boundPod is b bound to alloc's node with alloc as its annotation.
func boundPod(b *vgputest.PodBuilder, alloc vgpu.PodAllocation) *corev1.Pod {
	s, err := vgpu.EncodePodAllocation(alloc)
	if err != nil {
		panic(err)
	}
	return b.NodeName(alloc.Node).Annotation(vgpu.AnnotationPodAllocation, s).Obj()
}

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
				st.addLocked(&Entry{uid: unbound.UID, node: "n1", raw: raw, alloc: alloc, req: base.PodRequest(), reserved: true})
				st.mu.Unlock()
			}
			var err error
			for _, p := range tt.events {
				if e := st.UpsertPod(p); e != nil {
					err = e
				}
			}
			if (err != nil) != tt.wantErr {
				t.Errorf("error %v, want error %t", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, st.Usage("n1").GPU("n1-GPU-0")); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
			if got := st.Reservations() == 1; got != tt.stillReserved {
				t.Errorf("reservation left %t, want %t", got, tt.stillReserved)
			}
			st.DeletePod(unbound.UID)
			if u := st.Usage("n1").GPU("n1-GPU-0"); u != (vgpu.GPUUsage{}) {
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
	e := &Entry{uid: "u", node: "n1", raw: raw, alloc: alloc, reserved: true}
	st.mu.Lock()
	st.addLocked(e)
	st.mu.Unlock()
	if !st.Release(e) || st.Release(e) {
		t.Error("release: want true once, then false")
	}
	confirmed := &Entry{uid: "uid-p", node: "n1", raw: raw, alloc: alloc, reserved: true}
	st.mu.Lock()
	st.addLocked(confirmed)
	st.mu.Unlock()
	if err := st.UpsertPod(boundPod(vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(1000), alloc)); err != nil {
		t.Fatal(err)
	}
	if st.Release(confirmed) {
		t.Error("released a reservation the informer had confirmed")
	}
	if got := st.Usage("n1").GPU("n1-GPU-0").MemoryMiB; got != 1000 {
		t.Errorf("usage %d MiB, want 1000", got)
	}
}

// TestUpsertLeaseIgnoresOtherLeases checks that only heartbeat Leases are
// kept: the kubelets' node Leases share the default namespace.
func TestUpsertLeaseIgnoresOtherLeases(t *testing.T) {
	st := testState()
	kubelet := vgputest.HeartbeatLease("n1", now).Obj()
	kubelet.Name = "n1"
	st.UpsertLease(kubelet)
	st.UpsertLease(vgputest.HeartbeatLease("n2", now).Obj())
	st.DeleteLease("n2")
	want := []string{vgpu.HeartbeatLeaseName("n2")}
	var got []string
	for name := range st.leases {
		got = append(got, name)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("leases kept (-want +got):\n%s", diff)
	}
}

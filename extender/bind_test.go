package extender

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestBind checks a successful bind: a parsable allocation on the pod, a
// Binding posted to the chosen node, and the pod counted once the informer
// sees it bound.
func TestBind(t *testing.T) {
	inv, n1 := gpuNode("n1", 2, 16384)
	e := newEnv(t, testConfig(), n1...)
	pod := slicePod("p", 4096)
	e.createPod(pod)

	if got := e.bind(pod, "n1"); got.Error != "" {
		t.Fatalf("bind: %s", got.Error)
	}
	// One request: the Binding, carrying the allocation. No read, no patch.
	var writes []string
	bound := false
	for _, a := range e.client.Actions() {
		if a.GetVerb() == "list" || a.GetVerb() == "watch" || a.GetResource().Resource == "events" {
			continue // events are written in the background (TestBindRecordsPlacement)
		}
		writes = append(writes, a.GetVerb()+" "+a.GetResource().Resource+"/"+a.GetSubresource())
		if a.Matches("create", "pods") && a.GetSubresource() == "binding" {
			b := a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)
			bound = b.Target.Kind == "Node" && b.Target.Name == "n1" && b.UID == pod.UID && b.Annotations[vgpu.AnnotationPodAllocation] != ""
		}
	}
	if diff := cmp.Diff([]string{"create pods/", "create pods/binding"}, writes); diff != "" || !bound {
		t.Errorf("requests after the pod's creation (-want +got):\n%s\nBinding to n1 with UID and allocation: %t", diff, bound)
	}
	got := e.getPod(pod)
	alloc, err := vgpu.ParsePodAllocation(got.Annotations[vgpu.AnnotationPodAllocation])
	if err != nil {
		t.Fatalf("allocation annotation: %v", err)
	}
	want := vgputest.Allocation("n1").Container("main").Slice("n1-GPU-0", 4096, 10).Obj()
	if diff := cmp.Diff(want, alloc); diff != "" {
		t.Errorf("allocation (-want +got):\n%s", diff)
	}
	if got.Spec.NodeName != "n1" {
		t.Errorf("spec.nodeName = %q, want n1", got.Spec.NodeName)
	}
	e.settled()
	if diff := cmp.Diff(map[string]vgpu.GPUUsage{"n1-GPU-0": {MemoryMiB: 4096, CoresPercent: 10, Slices: 1}}, usageTable(e.s, inv)); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}

	// Binding it again fails: it is bound.
	if got := e.bind(pod, "n1"); !strings.Contains(got.Error, `already bound to node "n1"`) {
		t.Errorf("second bind: Error = %q, want already bound", got.Error)
	}
}

// TestBindPodWithoutGPU checks that a pod without GPUs is bound without an
// allocation.
func TestBindPodWithoutGPU(t *testing.T) {
	_, n1 := gpuNode("n1", 1, 16384)
	e := newEnv(t, testConfig(), n1...)
	pod := vgputest.Pod("cpu").Container("main").Obj()
	e.createPod(pod)
	if got := e.bind(pod, "n1"); got.Error != "" {
		t.Fatalf("bind: %s", got.Error)
	}
	got := e.getPod(pod)
	if _, has := got.Annotations[vgpu.AnnotationPodAllocation]; has || got.Spec.NodeName != "n1" {
		t.Errorf("pod: annotations %v, node %q; want no allocation, node n1", got.Annotations, got.Spec.NodeName)
	}
}

// TestBindFailure checks every way a bind fails: the result names the
// cause, and no annotation and no reservation are left behind.
func TestBindFailure(t *testing.T) {
	rejectBinding := func(c k8stesting.FakeClient) { c.PrependReactor("create", "pods", forbidBinding) }
	conflictBinding := func(c k8stesting.FakeClient) {
		c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
			return a.GetSubresource() == "binding", nil, apierrors.NewConflict(podsResource.GroupResource(), "p", errors.New("the object has been modified"))
		})
	}
	inv, n1 := gpuNode("n1", 1, 16384)
	tests := []struct {
		name    string
		pod     *corev1.Pod
		args    func(*corev1.Pod) (uid types.UID, node string)
		reactor func(k8stesting.FakeClient)
		want    string
	}{
		{name: "binding rejected", reactor: rejectBinding, want: `bind pod default/p to node n1: pods "p" is forbidden: not on this node`},
		{name: "binding conflict", reactor: conflictBinding, want: "bind pod default/p to node n1: Operation cannot be fulfilled on pods \"p\": the object has been modified"},
		{name: "pod replaced", args: func(*corev1.Pod) (types.UID, string) { return "old-uid", "n1" },
			want: "pod default/p has UID uid-p, not old-uid: it was replaced"},
		{name: "node not ready", args: func(p *corev1.Pod) (types.UID, string) { return p.UID, "sick" },
			want: "node sick: plugin not ready: label hami.io/gpu.ready is \"false\""},
		{name: "does not fit", pod: slicePod("p", 20000), want: "node n1: " + fitMessage(t, slicePod("p", 20000), inv, nil)},
		{name: "invalid request", pod: vgputest.Pod("p").Container("main").GPU(1).Cores(150).Obj(),
			want: `pod default/p: invalid GPU request: container "main": hami.io/gpucores=150: must be an integer from 1 to 100`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sick := vgputest.PublishedNode(vgputest.Node("sick").GPU("sick-GPU-0", 16384).Obj()).Ready(false).Obj()
			pod := tt.pod
			if pod == nil {
				pod = slicePod("p", 4096)
			}
			client := newFakeClient(objects(n1, []runtime.Object{sick, pod})...)
			if tt.reactor != nil {
				tt.reactor(client)
			}
			e := startEnv(t, testConfig(), client)
			uid, node := pod.UID, "n1"
			if tt.args != nil {
				uid, node = tt.args(pod)
			}
			args := pod.DeepCopy()
			args.UID = uid
			if got := e.bind(args, node); got.Error != tt.want {
				t.Errorf("Error = %q\nwant    %q", got.Error, tt.want)
			}
			if got := e.getPod(pod); got.Annotations[vgpu.AnnotationPodAllocation] != "" || got.Spec.NodeName != "" {
				t.Errorf("pod left with allocation %q on node %q", got.Annotations[vgpu.AnnotationPodAllocation], got.Spec.NodeName)
			}
			if n := e.s.state.Reservations(); n != 0 {
				t.Errorf("%d reservations left", n)
			}
			if u := usageTable(e.s, inv); len(u) != 0 {
				t.Errorf("usage left on n1: %v", u)
			}
		})
	}
}

// TestBindLostReply checks that a Binding that succeeded although its
// reply was lost counts as a successful bind, and the allocation stays,
// also when the API server does not answer the first reads of the pod
// (it went down with the reply).
func TestBindLostReply(t *testing.T) {
	for _, failedReads := range []int64{0, 2} {
		t.Run(fmt.Sprintf("%d failed reads", failedReads), func(t *testing.T) { testBindLostReply(t, failedReads) })
	}
}

func testBindLostReply(t *testing.T, failedReads int64) {
	inv, n1 := gpuNode("n1", 1, 16384)
	pod := slicePod("p", 4096)
	client := newFakeClient(objects(n1, []runtime.Object{pod})...)
	var reads atomic.Int64
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if reads.Add(1) <= failedReads {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		obj, err := client.Tracker().Get(podsResource, "default", "p")
		if err != nil {
			return true, nil, err
		}
		b := a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)
		bound := obj.(*corev1.Pod).DeepCopy()
		bound.Spec.NodeName = "n1"
		bound.Annotations = b.Annotations
		if err := client.Tracker().Update(podsResource, bound, "default"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewTimeoutError("reply lost", 1)
	})
	e := startEnv(t, testConfig(), client)
	if got := e.bind(pod, "n1"); got.Error != "" {
		t.Fatalf("bind: %s", got.Error)
	}
	if got := e.getPod(pod); got.Annotations[vgpu.AnnotationPodAllocation] == "" {
		t.Error("allocation removed from a bound pod")
	}
	e.settled()
	if got := usageTable(e.s, inv)["n1-GPU-0"].MemoryMiB; got != 4096 {
		t.Errorf("n1-GPU-0 holds %d MiB, want 4096", got)
	}
}

// TestBindCountsHostOnce checks that a bind counts the pod's CPU and
// memory from its reservation, so that the informer seeing the pod bound
// changes nothing (the node is summarized once per bind), and that a
// failed bind leaves none of them counted.
func TestBindCountsHostOnce(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("fail=%v", fail), func(t *testing.T) {
			_, n1 := gpuNode("n1", 1, 16384)
			node := n1[0].(*corev1.Node)
			node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("8")
			node.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("32Gi")
			pod := vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(4096).Limit(corev1.ResourceCPU, "2").Obj()
			client := newFakeClient(objects(n1, []runtime.Object{pod})...)
			if fail {
				client.PrependReactor("create", "pods", forbidBinding)
			}
			// A fixed workload: a new snapshot of the online one would
			// rebuild every summary at a time of its own.
			cfg := testConfig()
			cfg.Workload = WorkloadDefault
			e := startEnv(t, cfg, client)
			st := e.s.state
			read := func() (uint64, vgpu.HostResources) {
				n, _ := st.Node("n1")
				return n.Gen, *n.HostFree
			}
			gen, _ := read()
			got := e.bind(pod, "n1")
			wantFree := vgpu.HostResources{CPUMilli: 6000, MemoryMiB: 32 << 10}
			if fail {
				if got.Error == "" {
					t.Fatal("bind succeeded against a failing API server")
				}
				wantFree.CPUMilli = 8000
			} else {
				if got.Error != "" {
					t.Fatal(got.Error)
				}
				e.settled()
				if g, _ := read(); g != gen+1 {
					t.Errorf("node generation went from %d to %d over a bind and its confirmation, want one summary rebuilt", gen, g)
				}
			}
			if _, free := read(); free != wantFree {
				t.Errorf("host free %+v, want %+v", free, wantFree)
			}
		})
	}
}

// forbidBinding is a reactor that refuses every Binding with a 403: the
// API server answered, so the pod is certainly not bound.
func forbidBinding(a k8stesting.Action) (bool, runtime.Object, error) {
	return a.GetSubresource() == "binding", nil, apierrors.NewForbidden(podsResource.GroupResource(), "p", errors.New("not on this node"))
}

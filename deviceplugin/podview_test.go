package deviceplugin

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestPodViewAllocation: the view parses a pod's allocation once per
// update, follows a changed annotation and forgets a deleted pod.
func TestPodViewAllocation(t *testing.T) {
	f := newHandoff(t, nil)
	first := allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0))
	second := allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 2048, 10))
	pod := gpuPod("p", time.Now(), first, "main")
	pod.UID = "uid-p"
	f.addPod(pod)

	cached := func() (vgpu.PodAllocation, bool) {
		f.view.mu.Lock()
		defer f.view.mu.Unlock()
		p, ok := f.view.allocs[pod.UID]
		return p.alloc, ok
	}
	f.waitView("the first allocation parsed", func() bool { _, ok := cached(); return ok })
	got, _ := f.view.Pod(pod.Namespace, pod.Name)
	alloc, ok, err := f.view.Allocation(got)
	if !ok || err != nil {
		t.Fatalf("Allocation = _, %v, %v; want an allocation", ok, err)
	}
	if diff := cmp.Diff(*first, alloc); diff != "" {
		t.Errorf("Allocation (-want +got):\n%s", diff)
	}

	value, err := vgpu.EncodePodAllocation(*second)
	if err != nil {
		t.Fatal(err)
	}
	got = got.DeepCopy()
	got.Annotations[vgpu.AnnotationPodAllocation] = value
	if _, err := f.client.CoreV1().Pods(got.Namespace).Update(context.Background(), got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitView("the second allocation parsed", func() bool {
		a, ok := cached()
		return ok && cmp.Equal(*second, a)
	})
	got, _ = f.view.Pod(pod.Namespace, pod.Name)
	if alloc, _, _ := f.view.Allocation(got); !cmp.Equal(*second, alloc) {
		t.Errorf("Allocation after the update (-want +got):\n%s", cmp.Diff(*second, alloc))
	}

	f.deletePod(pod.Namespace, pod.Name)
	f.waitView("the allocation forgotten", func() bool { _, ok := cached(); return !ok })
}

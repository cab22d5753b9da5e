package extender

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/internal/fuzzcost"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

// hugeExclude is a 200 KiB hami.io/gpu-model-exclude value, as a pod created
// past the webhook (kube-system) may carry.
var hugeExclude = strings.Repeat("40GB,", 40960)

// hugeExcludeError is the message that names it.
var hugeExcludeError = `pod kube-system/big: invalid placement annotation: hami.io/gpu-model-exclude="` +
	hugeExclude[:64] + `…" (204800 bytes): must be at most 4096 bytes: at most 32 models of at most 96 bytes each`

// bigPod is a GPU pod in kube-system with the 200 KiB exclude list.
func bigPod() *corev1.Pod {
	return vgputest.Pod("big").Namespace("kube-system").Annotation(vgpu.AnnotationGPUModelExclude, hugeExclude).
		Container("main").GPU(1).MemoryPercent(50).Obj()
}

// TestFilterOverLimitPod: Filter refuses a pod whose placement annotation
// is over vgpu's limits with Error naming the key, the limit and the
// length (kube-scheduler's FailedScheduling event says it), without reading
// the value past its length or taking the state's lock that every other
// pod's Filter needs: it answers while a writer holds that lock, and
// allocates a few kilobytes however long the value and however many nodes.
func TestFilterOverLimitPod(t *testing.T) {
	objs := objects()
	names := make([]string, 20)
	for i := range names {
		names[i] = fmt.Sprintf("n%d", i)
		_, o := gpuNode(names[i], 8, 81920)
		objs = append(objs, o...)
	}
	e := newEnv(t, testConfig(), objs...)
	args := &extenderv1.ExtenderArgs{Pod: bigPod(), NodeNames: &names}
	want := &extenderv1.ExtenderFilterResult{
		FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}, Error: hugeExcludeError,
	}

	resume := e.s.state.Stall() // as an informer's update or a new workload's rebuild does
	answered := make(chan *extenderv1.ExtenderFilterResult, 1)
	go func() {
		got, err := e.s.Filter(context.Background(), args)
		if err != nil {
			t.Errorf("Filter: %v", err)
		}
		answered <- got
	}()
	select {
	case got := <-answered:
		resume()
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Filter (-want +got):\n%s", diff)
		}
	case <-time.After(20 * time.Second):
		resume()
		<-answered
		t.Fatal("Filter of the over-limit pod waited for the state's lock")
	}

	const budget = 16 << 10
	got := fuzzcost.Measure(20, func() { _, _ = e.s.Filter(context.Background(), args) }).Bytes
	t.Logf("Filter of the over-limit pod on %d nodes: %d bytes", len(names), got)
	if got > budget {
		t.Errorf("Filter of the over-limit pod allocates %d bytes, want at most %d (the value is %d bytes)", got, budget, len(hugeExclude))
	}
}

// TestOnlineWorkloadSkipsOverLimitPod: a pod over vgpu's limits, created
// past the webhook, is never counted into the online workload; the pods
// after it are.
func TestOnlineWorkloadSkipsOverLimitPod(t *testing.T) {
	t.Parallel()
	_, a := gpuNode("a", 2, 32768)
	e := newEnv(t, testConfig(), a...)
	e.createPod(bigPod())
	e.createPod(vgputest.Pod("ok").Container("main").GPU(1).MemoryPercent(25).Obj())
	tr := e.s.workload
	var classes []vgpu.WorkloadClass
	var counted int
	waitFor(t, "the pod after the over-limit one counted", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		classes, counted = tr.live.Classes(), tr.counted
		return len(classes) > 0
	})
	if counted != 1 {
		t.Errorf("%d pods counted, want 1 (not the over-limit pod)", counted)
	}
	for _, c := range classes {
		if c.MemoryPercent != 25 || len(c.ExcludeModels) > 0 {
			t.Errorf("the workload learnt class %d%% of %d GPU with %d excluded models; want only the 25%% class",
				c.MemoryPercent, c.GPUs, len(c.ExcludeModels))
		}
	}
}

// TestTrimKeepsReadAnnotationsBounded: of a pod's annotations the cache
// keeps only those the extender reads, and of a value over its limit a
// copy of its first limit+1 bytes, which reads as over the limit again; a
// pod with only other hami.io/ annotations and no GPU is kept as metadata.
func TestTrimKeepsReadAnnotationsBounded(t *testing.T) {
	t.Parallel()
	trim := trimmer(vgpu.ResourceGPU, nil)
	pod := bigPod()
	pod.Annotations["hami.io/notes"] = strings.Repeat("n", 100<<10)
	pod.Annotations[vgpu.AnnotationGPUPolicy] = "spread"
	obj, err := trim(pod)
	if err != nil {
		t.Fatal(err)
	}
	kept, ok := obj.(*gpuPod)
	if !ok {
		t.Fatalf("trimmed GPU pod is a %T, want a *gpuPod", obj)
	}
	want := map[string]string{
		vgpu.AnnotationGPUModelExclude: hugeExclude[:vgpu.MaxPlacementValueLength+1],
		vgpu.AnnotationGPUPolicy:       "spread",
	}
	if diff := cmp.Diff(want, kept.Annotations); diff != "" {
		t.Errorf("kept annotations (-want +got):\n%s", diff)
	}
	_, err = cluster.DemandOf(kept.pod())
	var ae *vgpu.AnnotationError
	if !errors.As(err, &ae) || ae.Key != vgpu.AnnotationGPUModelExclude || !strings.Contains(err.Error(), "must be at most 4096 bytes") {
		t.Errorf("demand of the kept pod: %v, want the exclude list over its limit", err)
	}

	other := vgputest.Pod("q").Annotation("hami.io/notes", "x").Container("main").Obj()
	if obj, err := trim(other); err != nil || !isPodMeta(obj) {
		t.Errorf("pod with only an unread hami.io/ annotation trimmed to %T (%v), want metadata only", obj, err)
	}
}

func isPodMeta(obj any) bool {
	_, ok := obj.(*podMeta)
	return ok
}

// BenchmarkFilterModelExclude is one cold Filter (a model filter no pod
// had before, so no verdict is remembered) over 1,000 nodes of 8 GPUs
// holding 8,000 slices, per exclude list: one model, the most the limits
// allow (32 models of 96 bytes), and a 200 KiB list, which Filter refuses.
func BenchmarkFilterModelExclude(b *testing.B) {
	s, names := benchScheduler(b, 1000, 8000, vgpu.PolicyBinpack)
	atLimit := make([]string, vgpu.MaxListItems-1)
	for i := range atLimit {
		atLimit[i] = fmt.Sprintf("%096d", i)
	}
	for _, bc := range []struct {
		name, list string
	}{{"one", ""}, {"at-limit", strings.Join(atLimit, ",") + ","}, {"200KiB", hugeExclude}} {
		b.Run(bc.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				pod := vgputest.Pod("p").Annotation(vgpu.AnnotationGPUModelExclude, fmt.Sprintf("%sx%d", bc.list, i)).
					Container("main").GPU(1).MemoryMiB(2048).Obj()
				if _, err := s.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package extender

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpuslice/gpuslice/internal/metricstest"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

// TestRetryAfterChange runs the informers and the retry loop on a fake
// clientset: a pod turned away while a node's plugin was not ready, while
// memory was short, or while the heartbeat was stale gets the retry
// annotation once the change reaches the extender; a pod turned away after
// the change does not.
func TestRetryAfterChange(t *testing.T) {
	_, n1 := gpuNode("n1", 1, 16384)
	node := n1[0].(*corev1.Node).DeepCopy()
	node.Labels[vgpu.LabelGPUReady] = "false"
	running := boundPod(vgputest.Pod("running").Container("main").GPU(1).MemoryMiB(12288).Cores(10),
		vgputest.Allocation("n1").Container("main").Slice("n1-GPU-0", 12288, 10).Obj())
	e := newEnv(t, testConfig(), node, n1[1], running)
	ctx := context.Background()
	retried := func(pod *corev1.Pod) bool { return e.getPod(pod).Annotations[AnnotationRetry] != "" }

	waiter := slicePod("waiter", 1024)
	e.createPod(waiter)
	if v := e.filter(waiter, "n1"); len(*v.NodeNames) != 0 {
		t.Fatalf("waiter passed n1 while its label is false: %+v", v)
	}
	node.Labels[vgpu.LabelGPUReady] = "true"
	if _, err := e.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiter asked to retry after n1 turned ready", func() bool { return retried(waiter) })
	if v := e.getPod(waiter).Annotations[AnnotationRetry]; v == "" {
		t.Fatal("no retry annotation")
	} else if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
		t.Errorf("retry annotation %q: %v", v, err)
	}
	// kube-scheduler's retry: the waiter passes now.
	if v := e.filter(waiter, "n1"); len(*v.NodeNames) != 1 {
		t.Fatalf("waiter does not pass n1 once ready: %+v", v)
	}

	// late is turned away for memory after every change so far: it waits
	// until running is deleted.
	late := slicePod("late", 8192)
	e.createPod(late)
	if v := e.filter(late, "n1"); len(*v.NodeNames) != 0 {
		t.Fatalf("late passed n1 with 4096 MiB free: %+v", v)
	}
	if _, pods, _ := e.s.dueRetries(); len(pods) != 0 {
		t.Errorf("due before running was deleted: %+v", pods)
	}
	if err := e.client.CoreV1().Pods(running.Namespace).Delete(ctx, running.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "late asked to retry after running was deleted", func() bool { return retried(late) })
	if v := e.filter(late, "n1"); len(*v.NodeNames) != 1 {
		t.Fatalf("late does not pass n1 once running is gone: %+v", v)
	}

	// Stale heartbeat: a pod turned away for it is asked to retry once the
	// Lease is renewed, which kube-scheduler never sees.
	e.clock.SetTime(now.Add(3 * time.Minute))
	stale := slicePod("stale", 1024)
	e.createPod(stale)
	if got := e.filter(stale, "n1").FailedAndUnresolvableNodes["n1"]; got == "" {
		t.Fatal("stale passed n1 with a heartbeat three minutes old")
	}
	lease := vgputest.HeartbeatLease("n1", now.Add(3*time.Minute)).Obj()
	if _, err := e.client.CoordinationV1().Leases(lease.Namespace).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stale asked to retry after the Lease was renewed", func() bool { return retried(stale) })

	// A pod turned away after the last change stays as it is.
	after := slicePod("after", 1024)
	e.createPod(after)
	e.filter(after, "missing-node")
	if _, pods, _ := e.s.dueRetries(); len(pods) != 0 {
		t.Errorf("due after the last change: %+v", pods)
	}
	if got := metricstest.Scrape(t, nil, e.srv.URL+"/metrics")[MetricRetries]; got != 3 {
		t.Errorf("%s = %v, want 3 (waiter, late, stale)", MetricRetries, got)
	}
}

// TestRetryWhenTheSampleIsFull checks that a pod turned away by every node
// of a sample kube-scheduler sent (exactly sampleSize of the nodes, with
// percentageOfNodesToScore below 100) is due at once when a node it was
// not sent fits it; and not when the list is shorter (kube-scheduler's
// own filters let only those through) or no other node fits.
func TestRetryWhenTheSampleIsFull(t *testing.T) {
	var objs []runtime.Object
	var full []string
	for i := range 100 {
		name := fmt.Sprintf("full-%03d", i)
		_, o := gpuNode(name, 1, 4096)
		objs = append(objs, o...)
		full = append(full, name)
	}
	_, free := gpuNode("free", 1, 16384)
	e := newEnv(t, testConfig(), objects(objs, free)...)
	due := func() []string {
		_, pods, _ := e.s.dueRetries()
		var names []string
		for _, p := range pods {
			names = append(names, p.Name)
		}
		return names
	}
	// 101 nodes: kube-scheduler's adaptive sample is 100 of them.
	filtered := slicePod("filtered", 8192)
	if got := e.filter(filtered, full[:99]...); len(*got.NodeNames) != 0 {
		t.Fatalf("filtered passed a full node: %+v", got)
	}
	if got := due(); len(got) != 0 {
		t.Errorf("due after 99 full nodes (not a sample): %v, want none", got)
	}
	sampled := slicePod("sampled", 8192)
	e.filter(sampled, full...)
	if got := due(); !slices.Equal(got, []string{"sampled"}) {
		t.Errorf("due after a sample of full nodes with room elsewhere: %v, want sampled", got)
	}
	big := slicePod("big", 32768)
	e.filter(big, full...)
	if got := due(); len(got) != 0 {
		t.Errorf("due with no room anywhere: %v, want none", got)
	}
}

// TestSampleSize checks sampleSize against kube-scheduler's rule.
func TestSampleSize(t *testing.T) {
	tests := []struct{ percentage, all, want int }{
		{0, 50, 50}, {0, 100, 100}, {0, 101, 100}, {0, 1000, 420}, {0, 5000, 500}, {0, 10000, 500},
		{100, 1000, 1000}, {30, 1000, 300}, {30, 200, 100},
	}
	for _, tt := range tests {
		if got := cluster.SampleSize(tt.percentage, tt.all); got != tt.want {
			t.Errorf("sampleSize(%d, %d) = %d, want %d", tt.percentage, tt.all, got, tt.want)
		}
	}
}

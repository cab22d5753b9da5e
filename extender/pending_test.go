package extender

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/metricstest"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestPendingAndUnregisteredMetrics scrapes the waiting pods by reason
// and the nodes Ready but not registered: a pod too large for the only
// GPU node waits with NoRoom; a Ready node whose condition is False is
// unregistered with its reason, one with a stale heartbeat HeartbeatStale.
func TestPendingAndUnregisteredMetrics(t *testing.T) {
	inv, n1 := gpuNode("n1", 1, 16384)
	n1[0] = vgputest.PublishedNode(*inv).Condition(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady").
		Condition(vgpu.ConditionRegistered, corev1.ConditionTrue, vgpu.ReasonRegistered).Obj()
	inv2, _ := gpuNode("n2", 1, 16384)
	n2 := vgputest.PublishedNode(*inv2).Condition(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady").
		Condition(vgpu.ConditionRegistered, corev1.ConditionFalse, vgpu.ReasonRegisterFailed).Obj()
	inv3, _ := gpuNode("n3", 1, 16384)
	n3 := vgputest.PublishedNode(*inv3).Condition(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady").
		Condition(vgpu.ConditionRegistered, corev1.ConditionTrue, vgpu.ReasonRegistered).Obj()
	e := newEnv(t, testConfig(), append(n1, n2, n3, vgputest.HeartbeatLease("n2", now).Obj(),
		vgputest.HeartbeatLease("n3", now.Add(-2*DefaultHeartbeatMaxAge)).Obj())...)
	big := slicePod("big", 32768)
	e.createPod(big)
	if got := e.filter(big, "n1"); got.NodeNames != nil && len(*got.NodeNames) != 0 {
		t.Fatalf("filter passed %v for a pod larger than the GPU", got.NodeNames)
	}
	got := metricstest.Pick(metricstest.Scrape(t, nil, e.srv.URL+"/metrics"), MetricPendingPods, MetricPendingOldestSecond, MetricNodeUnregistered)
	s := metricstest.Series
	want := map[string]float64{
		s(MetricPendingPods, "reason", PendingNoRoom): 1, s(MetricPendingPods, "reason", PendingNoMatchingGPU): 0, s(MetricPendingPods, "reason", PendingPluginNotReady): 0,
		s(MetricPendingOldestSecond, "reason", PendingNoRoom): 0, s(MetricPendingOldestSecond, "reason", PendingNoMatchingGPU): 0, s(MetricPendingOldestSecond, "reason", PendingPluginNotReady): 0,
		s(MetricNodeUnregistered, "node", "n2", "reason", vgpu.ReasonRegisterFailed): 1,
		s(MetricNodeUnregistered, "node", "n3", "reason", vgpu.ReasonHeartbeatStale): 1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	e.clock.SetTime(now.Add(90e9))
	got = metricstest.Pick(metricstest.Scrape(t, nil, e.srv.URL+"/metrics"), MetricPendingOldestSecond)
	if v := got[s(MetricPendingOldestSecond, "reason", PendingNoRoom)]; v != 90 {
		t.Errorf("oldest NoRoom wait %v s, want 90", v)
	}
}

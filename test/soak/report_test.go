package soak

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLostAtAdmission: of the pods a kubelet failed, those it refused at admission for want
// of devices are a figure of their own in the summary, with its goal of 0 and an example
// that names the node, the times and the node's latest kubelet or plugin restart before the
// failure; others count only by reason.
func TestLostAtAdmission(t *testing.T) {
	bound := time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)
	failed := func(name, node, reason, message string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: reason, Message: message, Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(bound)},
			}},
		}
	}
	tl := newTally()
	seen := bound.Add(1500 * time.Millisecond)
	tl.nodeFault("node-a", "kubelet SIGKILL", bound.Add(-2*time.Second))
	tl.nodeFault("node-a", "device plugin SIGTERM", bound.Add(300*time.Millisecond))
	tl.nodeFault("node-a", "kubelet SIGTERM", seen.Add(time.Second)) // after the failure: not its cause
	tl.failed(failed("p1", "node-a", "UnexpectedAdmissionError", "Allocate failed due to requested number of devices unavailable for hami.io/gpu. Requested: 1, Available: 0, which is unexpected"), seen)
	tl.failed(failed("p2", "node-b", "OutOfhami.io/gpu", "Node didn't have enough resource: hami.io/gpu, requested: 1, used: 0, capacity: 0"), seen)
	tl.failed(failed("p3", "node-c", "Evicted", "The node was low on resource: memory."), seen)
	r := tl.report()

	if diff := cmp.Diff(map[string]int{"UnexpectedAdmissionError": 1, "OutOfhami.io/gpu": 1, "Evicted": 1}, r.FailedAtAdmission); diff != "" {
		t.Errorf("failed pods by reason (-want +got):\n%s", diff)
	}
	if r.LostAtAdmission != 2 {
		t.Errorf("LostAtAdmission = %d, want 2 (UnexpectedAdmissionError and OutOfhami.io/gpu, not Evicted)", r.LostAtAdmission)
	}
	summary := r.String()
	for _, want := range []string{
		"pods lost at kubelet admission for want of devices: 2 (goal 0)",
		"p1 on node-a, bound 09:26:53.000, seen failed 09:26:54.500 (latest restart on node-a: device plugin SIGTERM at 09:26:53.300, 300ms after the bind): UnexpectedAdmissionError: Allocate failed due to requested number of devices unavailable",
		"p2 on node-b, bound 09:26:53.000, seen failed 09:26:54.500 (no kubelet or plugin restart on node-b before it): OutOfhami.io/gpu:",
	} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}
	if strings.Contains(summary, "p3 on node-c, bound") {
		t.Errorf("summary counts the evicted pod as lost at admission:\n%s", summary)
	}
}

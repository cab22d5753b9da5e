package publish

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

func TestNextConditionKeepsTransitionTime(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	t1 := t0.Add(time.Minute)
	old := &corev1.NodeCondition{Type: vgpu.ConditionRegistered, Status: corev1.ConditionFalse, Reason: vgpu.ReasonKubeletSocketMissing, Message: "m",
		LastHeartbeatTime: metav1.NewTime(t0), LastTransitionTime: metav1.NewTime(t0)}
	if _, changed := NextCondition(old, Condition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonKubeletSocketMissing, Message: "m"}, t1); changed {
		t.Error("the same condition counts as a change")
	}
	got, changed := NextCondition(old, Condition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonRegisterFailed, Message: "n"}, t1)
	if !changed || !got.LastTransitionTime.Time.Equal(t0) || !got.LastHeartbeatTime.Time.Equal(t1) {
		t.Errorf("reason change: changed=%v transition=%v heartbeat=%v, want true %v %v", changed, got.LastTransitionTime, got.LastHeartbeatTime, t0, t1)
	}
	got, _ = NextCondition(old, Condition{Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered, Message: "ok"}, t1)
	if !got.LastTransitionTime.Time.Equal(t1) {
		t.Errorf("status change: transition=%v, want %v", got.LastTransitionTime, t1)
	}
}

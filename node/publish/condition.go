package publish

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// ConditionGrace is how long the publisher waits before it turns a True
// vgpu.ConditionRegistered False for a registration problem
// (KubeletSocketMissing, RegisterFailed). A kubelet restart deletes the
// agent's socket and re-registration takes milliseconds to a few seconds;
// the condition should not flap for that. A problem outlasting the grace,
// or one present when the condition is not True, is written at once.
const ConditionGrace = 10 * time.Second

// NextCondition returns the condition to write over old (nil: none yet)
// for want at now, and false when old already says the same. The
// transition time moves only with the status, as the kubelet does for
// Ready; the heartbeat time is the time of the write (the Lease carries
// liveness, so the condition is written only on change).
func NextCondition(old *corev1.NodeCondition, want Condition, now time.Time) (corev1.NodeCondition, bool) {
	if old != nil && old.Status == want.Status && old.Reason == want.Reason && old.Message == want.Message {
		return *old, false
	}
	t := metav1.NewTime(now)
	c := corev1.NodeCondition{
		Type: vgpu.ConditionRegistered, Status: want.Status, Reason: want.Reason, Message: want.Message,
		LastHeartbeatTime: t, LastTransitionTime: t,
	}
	if old != nil && old.Status == want.Status {
		c.LastTransitionTime = old.LastTransitionTime
	}
	return c, true
}

// conditionPatch is the strategic merge patch of nodes/status that sets c;
// the API server merges conditions by type, so no other condition changes.
func conditionPatch(c corev1.NodeCondition) ([]byte, error) {
	data, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}})
	if err != nil {
		return nil, fmt.Errorf("condition patch: %w", err)
	}
	return data, nil
}

// syncCondition writes want to the Node when it differs from what the
// Node holds (p.nodeCondition, read by syncNode). It defers turning a True
// condition False for a registration problem younger than ConditionGrace,
// and then asks Run to look again by setting p.recheck.
func (p *Publisher) syncCondition(ctx context.Context, reg Registration, want Condition) error {
	old := p.nodeCondition
	if old != nil && old.Status == corev1.ConditionTrue && want.Status != corev1.ConditionTrue && !reg.Since.IsZero() &&
		(want.Reason == vgpu.ReasonKubeletSocketMissing || want.Reason == vgpu.ReasonRegisterFailed) {
		if left := ConditionGrace - p.clock.Since(reg.Since); left > 0 {
			p.recheck = left
			return nil
		}
	}
	c, changed := NextCondition(old, want, p.clock.Now())
	if !changed {
		return nil
	}
	patch, err := conditionPatch(c)
	if err != nil {
		return err
	}
	n, err := p.client.PatchNodeStatus(ctx, p.cfg.NodeName, patch, metav1.PatchOptions{FieldManager: p.cfg.FieldManager})
	if err != nil {
		return fmt.Errorf("patch node %s status condition %s: %w", p.cfg.NodeName, vgpu.ConditionRegistered, err)
	}
	p.remember(n)
	return nil
}

// ReportStartFailure sets the Node's vgpu.ConditionRegistered to False
// with reason (vgpu.ReasonDriverNotFound) and message, for an agent that
// cannot start; its main calls it before exiting. It reads the Node once
// and writes, as fieldManager, only when the condition differs. now stamps
// the condition.
func ReportStartFailure(ctx context.Context, client API, nodeName, fieldManager, reason, message string, now time.Time) error {
	n, err := client.GetNode(ctx, nodeName)
	if err != nil {
		return fmt.Errorf("get node %s: %w", nodeName, err)
	}
	var old *corev1.NodeCondition
	if c, ok := vgpu.RegisteredCondition(n); ok {
		old = &c
	}
	c, changed := NextCondition(old, Condition{corev1.ConditionFalse, reason, message}, now)
	if !changed {
		return nil
	}
	patch, err := conditionPatch(c)
	if err != nil {
		return err
	}
	if _, err := client.PatchNodeStatus(ctx, nodeName, patch, metav1.PatchOptions{FieldManager: fieldManager}); err != nil {
		return fmt.Errorf("patch node %s status condition %s: %w", nodeName, vgpu.ConditionRegistered, err)
	}
	return nil
}

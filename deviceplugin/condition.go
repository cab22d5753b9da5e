package deviceplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"
)

// conditionGrace is how long the plugin waits before it turns a True
// vgpu.ConditionRegistered False for a registration problem
// (KubeletSocketMissing, RegisterFailed). A kubelet restart deletes the
// plugin's socket and re-registration takes milliseconds to a few seconds;
// the condition should not flap for that. A problem outlasting the grace,
// or one present when the condition is not True, is written at once.
const conditionGrace = 10 * time.Second

// Node event reasons the plugin records (kubectl describe node lists them).
const (
	EventRegistered   = "GPUSliceRegistered"
	EventReregistered = "GPUSliceReregistered"
	EventGPUUnhealthy = "GPUUnhealthy"
	EventGPUHealthy   = "GPUHealthy"
)

// wantCondition is the vgpu.ConditionRegistered the plugin's state calls
// for; ok is false when the state says nothing yet (before the first
// registration attempt).
type wantCondition struct {
	Status  corev1.ConditionStatus
	Reason  string
	Message string
}

// desiredCondition maps the registration and the inventory to the node
// condition. It is a pure function of its arguments.
func desiredCondition(cfg Config, reg registration, node vgpu.NodeInventory) (wantCondition, bool) {
	if reg.Registered {
		healthy := 0
		var sick []string
		for _, g := range node.GPUs {
			if g.Health == vgpu.Healthy {
				healthy++
			} else {
				sick = append(sick, g.UUID)
			}
		}
		if healthy == 0 {
			msg := fmt.Sprintf("registered %s with the kubelet, but no GPU is advertised (excludeGPUs leaves none)", cfg.ResourceName)
			if len(sick) > 0 {
				msg = fmt.Sprintf("registered %s with the kubelet, but all %d GPUs are unhealthy (%s); see the %s events", cfg.ResourceName, len(sick), strings.Join(sick, ", "), EventGPUUnhealthy)
			}
			return wantCondition{corev1.ConditionFalse, vgpu.ReasonNoHealthyGPUs, msg}, true
		}
		return wantCondition{corev1.ConditionTrue, vgpu.ReasonRegistered, fmt.Sprintf("registered %s with the kubelet: %d of %d GPUs healthy, %d devices each",
			cfg.ResourceName, healthy, len(node.GPUs), node.SplitCount)}, true
	}
	if reg.Problem == "" {
		return wantCondition{}, false
	}
	return wantCondition{corev1.ConditionFalse, reg.Problem, reg.Detail}, true
}

// nextCondition returns the condition to write over old (nil: none yet)
// for want at now, and false when old already says the same. The
// transition time moves only with the status, as the kubelet does for
// Ready; the heartbeat time is the time of the write (the Lease carries
// liveness, so the condition is written only on change).
func nextCondition(old *corev1.NodeCondition, want wantCondition, now time.Time) (corev1.NodeCondition, bool) {
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
// condition False for a registration problem younger than conditionGrace,
// and then asks run to look again by setting p.recheck.
func (p *publisher) syncCondition(ctx context.Context, reg registration, want wantCondition) error {
	old := p.nodeCondition
	if old != nil && old.Status == corev1.ConditionTrue && want.Status != corev1.ConditionTrue && !reg.Since.IsZero() &&
		(want.Reason == vgpu.ReasonKubeletSocketMissing || want.Reason == vgpu.ReasonRegisterFailed) {
		if left := conditionGrace - p.clock.Since(reg.Since); left > 0 {
			p.recheck = left
			return nil
		}
	}
	c, changed := nextCondition(old, want, p.clock.Now())
	if !changed {
		return nil
	}
	patch, err := conditionPatch(c)
	if err != nil {
		return err
	}
	n, err := p.client.PatchNodeStatus(ctx, p.cfg.NodeName, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil {
		return fmt.Errorf("patch node %s status condition %s: %w", p.cfg.NodeName, vgpu.ConditionRegistered, err)
	}
	p.remember(n)
	return nil
}

// ReportStartFailure sets the Node's vgpu.ConditionRegistered to False
// with reason (vgpu.ReasonDriverNotFound) and message, for a plugin that
// cannot start; main calls it before exiting. It reads the Node once and
// writes only when the condition differs. now stamps the condition.
func ReportStartFailure(ctx context.Context, client API, nodeName, reason, message string, now time.Time) error {
	n, err := client.GetNode(ctx, nodeName)
	if err != nil {
		return fmt.Errorf("get node %s: %w", nodeName, err)
	}
	var old *corev1.NodeCondition
	if c, ok := vgpu.RegisteredCondition(n); ok {
		old = &c
	}
	c, changed := nextCondition(old, wantCondition{corev1.ConditionFalse, reason, message}, now)
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

// nodeRef is the reference node events are recorded on. Its UID is the
// node's name, as the kubelet's are, so kubectl describe node lists them.
func nodeRef(name string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(name)}
}

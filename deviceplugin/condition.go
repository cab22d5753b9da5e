package deviceplugin

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/node/publish"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Node event reasons the plugin records (kubectl describe node lists them).
const (
	EventRegistered   = "GPUSliceRegistered"
	EventReregistered = "GPUSliceReregistered"
	EventGPUUnhealthy = "GPUUnhealthy"
	EventGPUHealthy   = "GPUHealthy"
)

// desiredCondition maps the registration and the inventory to the node
// condition; false when the state says nothing yet (before the first
// registration attempt). It is a pure function of its arguments.
func desiredCondition(cfg Config, reg registration, node vgpu.NodeInventory) (publish.Condition, bool) {
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
			return publish.Condition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonNoHealthyGPUs, Message: msg}, true
		}
		return publish.Condition{Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered, Message: fmt.Sprintf("registered %s with the kubelet: %d of %d GPUs healthy, %d devices each",
			cfg.ResourceName, healthy, len(node.GPUs), node.SplitCount)}, true
	}
	if reg.Problem == "" {
		return publish.Condition{}, false
	}
	return publish.Condition{Status: corev1.ConditionFalse, Reason: reg.Problem, Message: reg.Detail}, true
}

// ReportStartFailure sets the Node's vgpu.ConditionRegistered to False
// with reason (vgpu.ReasonDriverNotFound) and message, for a plugin that
// cannot start; main calls it before exiting (publish.ReportStartFailure).
func ReportStartFailure(ctx context.Context, client API, nodeName, reason, message string, now time.Time) error {
	return publish.ReportStartFailure(ctx, client, nodeName, fieldManager, reason, message, now)
}

// nodeRef is the reference node events are recorded on. Its UID is the
// node's name, as the kubelet's are, so kubectl describe node lists them.
func nodeRef(name string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(name)}
}

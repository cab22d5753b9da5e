package vgpu

import (
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Reasons a scheduler turns a node away before Fit: the node's device
// plugin is not serving it. Every message of these starts with
// NotReadyPrefix. The scheduler extender judges nodes with PluginReadiness
// of NodeReadiness; gpuslice why calls the same functions, so both say the
// same.
const (
	// ReasonNoInventory: the Node has no AnnotationNodeInventory.
	ReasonNoInventory Reason = "NoInventory"
	// ReasonMalformedInventory: the inventory does not parse, or names
	// another node.
	ReasonMalformedInventory Reason = "MalformedInventory"
	// ReasonReadyLabel: LabelGPUReady is missing or not "true".
	ReasonReadyLabel Reason = "ReadyLabel"
	// ReasonNoAllocatable: the Node's allocatable resource is missing or 0.
	ReasonNoAllocatable Reason = "NoAllocatable"
	// ReasonNoHeartbeat: no heartbeat Lease, or one without renewTime.
	ReasonNoHeartbeat Reason = "NoHeartbeat"
	// ReasonStaleHeartbeat: the heartbeat Lease was renewed longer ago than
	// the reader's maximum age.
	ReasonStaleHeartbeat Reason = "StaleHeartbeat"
	// ReasonNotRegistered: the heartbeat says the plugin is not registered
	// with the kubelet, or does not parse.
	ReasonNotRegistered Reason = "NotRegistered"
)

// NotReadyPrefix starts the message of every readiness reason.
const NotReadyPrefix = "plugin not ready: "

// DefaultHeartbeatMaxAge is the oldest heartbeat Lease renewal that still
// counts as alive (HeartbeatReadiness's maxAge) unless a reader is
// configured otherwise: a little more than the device plugin's default
// Lease duration (40 s), so one late renewal (every 10 s) does not turn a
// node away.
const DefaultHeartbeatMaxAge = 60 * time.Second

// ErrNoInventory is the inventory error of a Node without
// AnnotationNodeInventory, for NodeReadiness.
var ErrNoInventory = errors.New("no " + AnnotationNodeInventory + " annotation on the node")

// Readiness says whether a node's device plugin serves it and, when not,
// why. The zero value is ready.
type Readiness struct {
	// Reason is one of the readiness reasons; empty when ready.
	Reason Reason
	// Message says what is wrong, starting with NotReadyPrefix; it does not
	// name the node.
	Message string
}

// Ready reports whether the plugin serves the node.
func (r Readiness) Ready() bool { return r.Reason == "" }

func notReadyf(reason Reason, format string, args ...any) Readiness {
	return Readiness{Reason: reason, Message: NotReadyPrefix + fmt.Sprintf(format, args...)}
}

// NodeReadiness judges what a Node says of its device plugin, in this
// order: inventoryErr from reading its inventory (ErrNoInventory when the
// annotation is missing; nil when it parsed and names the node), its ready
// label (hasLabel false when missing) and its allocatable resource (0 when
// missing). It returns the first check that fails. Pure.
func NodeReadiness(inventoryErr error, label string, hasLabel bool, allocatable int64, resource corev1.ResourceName) Readiness {
	switch {
	case errors.Is(inventoryErr, ErrNoInventory):
		return notReadyf(ReasonNoInventory, "%v", inventoryErr)
	case inventoryErr != nil:
		return notReadyf(ReasonMalformedInventory, "%v", inventoryErr)
	case !hasLabel:
		return notReadyf(ReasonReadyLabel, "label %s is missing", LabelGPUReady)
	}
	if ready, err := ParseReadyLabel(label); err != nil {
		return notReadyf(ReasonReadyLabel, "label %s is %q (must be \"true\" or \"false\")", LabelGPUReady, label)
	} else if !ready {
		return notReadyf(ReasonReadyLabel, "label %s is %q", LabelGPUReady, label)
	}
	if allocatable <= 0 {
		return notReadyf(ReasonNoAllocatable, "allocatable %s is 0", resource)
	}
	return Readiness{}
}

// Heartbeat is a node's heartbeat Lease as HeartbeatReadiness reads it.
type Heartbeat struct {
	// Exists is false when there is no Lease.
	Exists bool
	// RenewTime is the Lease's spec.renewTime; zero when it has none.
	RenewTime time.Time
	// Raw is its AnnotationPluginHeartbeat; empty when missing (an older
	// plugin: only renewTime counts).
	Raw string
	// Parsed and Err are ParsePluginHeartbeat(Raw), when Raw is not empty.
	Parsed PluginHeartbeat
	Err    error
}

// PluginReadiness judges whether a node's device plugin serves it at now,
// the rule a scheduler applies before Fit: node, what NodeReadiness says of
// the Node's own fields, when it is not ready, else HeartbeatReadiness of
// the node's heartbeat h, renewed no longer than maxAge ago (heartbeat
// Leases in namespace). A caller that judges a node for many pods judges
// node once per change of the Node and passes it for each pod. Pure.
func PluginReadiness(node Readiness, h Heartbeat, now time.Time, maxAge time.Duration, namespace string) Readiness {
	if !node.Ready() {
		return node
	}
	return HeartbeatReadiness(h, now, maxAge, namespace)
}

// HeartbeatReadiness judges a node's heartbeat at now: there must be a
// Lease (in namespace, named in the message), renewed no longer than maxAge
// ago, whose heartbeat, if any, parses and says the plugin is registered.
// Pure.
func HeartbeatReadiness(h Heartbeat, now time.Time, maxAge time.Duration, namespace string) Readiness {
	switch {
	case !h.Exists:
		return notReadyf(ReasonNoHeartbeat, "no heartbeat Lease in namespace %s", namespace)
	case h.RenewTime.IsZero():
		return notReadyf(ReasonNoHeartbeat, "heartbeat Lease has no renewTime")
	case now.Sub(h.RenewTime) > maxAge:
		return notReadyf(ReasonStaleHeartbeat, "heartbeat Lease not renewed for more than %s", maxAge)
	case h.Raw != "" && h.Err != nil:
		return notReadyf(ReasonNotRegistered, "%v", h.Err)
	case h.Raw != "" && !h.Parsed.Registered:
		return notReadyf(ReasonNotRegistered, "heartbeat says the device plugin is not registered with the kubelet")
	}
	return Readiness{}
}

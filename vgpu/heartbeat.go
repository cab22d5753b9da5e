package vgpu

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

const (
	// DefaultHeartbeatNamespace is where the device plugin keeps its
	// heartbeat Leases unless configured otherwise: the namespace the kubelet
	// uses for its own node Leases.
	DefaultHeartbeatNamespace = "kube-node-lease"
	// heartbeatLeasePrefix starts every heartbeat Lease name.
	heartbeatLeasePrefix = "gpuslice-"
	// maxObjectNameLength is the longest DNS-1123 subdomain, the limit on a
	// Lease's name.
	maxObjectNameLength = 253
	// heartbeatLeaseHashDigits is how many hex digits of the node name's
	// SHA-256 end a shortened heartbeat Lease name.
	heartbeatLeaseHashDigits = 16
	// HeartbeatLeaseNodePrefix is how many leading characters of a node
	// name too long for "gpuslice-" + node a shortened heartbeat Lease name
	// keeps. The chart's node policy checks a shortened name by them (CEL
	// has no SHA-256), so its template repeats this number.
	HeartbeatLeaseNodePrefix = maxObjectNameLength - len(heartbeatLeasePrefix) - heartbeatLeaseHashDigits
)

// HeartbeatLeaseName returns the name of the node agent's heartbeat Lease
// for node: "gpuslice-" + node. node must be a Node's name (a DNS-1123
// subdomain, at most 253 characters). When that would exceed 253
// characters (node names over 244), it is "gpuslice-", the first
// HeartbeatLeaseNodePrefix (228) characters of node and 16 hex digits of
// the SHA-256 of node: 253 characters, a valid name whatever character the
// cut lands on (the digits follow a letter, a digit, "-" or "."), stable
// and practically unique, and one whose prefix a ValidatingAdmissionPolicy
// can check. The writer (node/publish) and the readers (the extender,
// kubectl gpuslice) call this same function.
func HeartbeatLeaseName(node string) string {
	name := heartbeatLeasePrefix + node
	if len(name) <= maxObjectNameLength {
		return name
	}
	sum := sha256.Sum256([]byte(node))
	return heartbeatLeasePrefix + node[:HeartbeatLeaseNodePrefix] + hex.EncodeToString(sum[:heartbeatLeaseHashDigits/2])
}

// IsHeartbeatLeaseName reports whether name can be a name HeartbeatLeaseName
// returns, so that readers of the heartbeat namespace can skip the kubelets'
// own node Leases there without parsing them.
func IsHeartbeatLeaseName(name string) bool {
	return strings.HasPrefix(name, heartbeatLeasePrefix)
}

// PluginHeartbeat is the device plugin's registration state with the
// kubelet, kept on its heartbeat Lease (AnnotationPluginHeartbeat). The
// Lease's renewTime says the plugin is alive; this says whether the kubelet
// currently knows it. It changes only when registration state changes.
type PluginHeartbeat struct {
	// Node is the name of the Node the plugin runs on; never empty.
	Node string
	// Mode is the node agent's mode: "" for the device plugin, NodeModeDRA
	// for the DRA driver (whose ResourceName is its driver name, and whose
	// node has no allocatable ResourceGPU).
	Mode string
	// PluginVersion is the plugin's build version; empty means unknown.
	PluginVersion string
	// ResourceName is the extended resource the plugin registered, normally
	// ResourceGPU; never empty.
	ResourceName string
	// Registered is true from a successful Register RPC until the plugin
	// sees the kubelet restart or its own socket vanish.
	Registered bool
	// RegisteredAt is when the plugin last registered, in UTC to the second
	// (encoding truncates). Zero means never since the plugin started;
	// never zero while Registered.
	RegisteredAt time.Time
	// Socket is the plugin's socket as given to the kubelet (the file name
	// in the kubelet's device-plugin folder); empty means none. Never empty
	// while Registered.
	Socket string
}

// Validate reports every way h breaks the rules stated on its fields.
// EncodePluginHeartbeat and ParsePluginHeartbeat call it.
func (h PluginHeartbeat) Validate() error {
	var errs []error
	if h.Node == "" {
		errs = append(errs, errors.New("node: must not be empty"))
	}
	if h.ResourceName == "" {
		errs = append(errs, errors.New("resourceName: must not be empty"))
	}
	if h.Mode != "" && h.Mode != NodeModeDRA {
		errs = append(errs, fmt.Errorf("mode=%q: must be empty (the device plugin) or %q", h.Mode, NodeModeDRA))
	}
	if y := h.RegisteredAt.UTC().Year(); !h.RegisteredAt.IsZero() && (y < 0 || y > 9999) {
		errs = append(errs, fmt.Errorf("registeredAt=%s: year must be from 0 to 9999", h.RegisteredAt))
	}
	if h.Registered && h.RegisteredAt.IsZero() {
		errs = append(errs, errors.New("registeredAt: must be set while registered"))
	}
	if h.Registered && h.Socket == "" {
		errs = append(errs, errors.New("socket: must be set while registered"))
	}
	return errors.Join(errs...)
}

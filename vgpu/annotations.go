package vgpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unique"
)

// The annotation and label protocol between gpuslice's components. Every key
// is here; every value has one Encode/Parse pair. Values are JSON objects with
// a "version" field. docs/protocol.md is the specification and its examples
// are this package's golden files.

// Keys and labels.
const (
	// AnnotationPrefix starts every annotation and label key of this
	// protocol; readers that cache pods may keep only the annotations with
	// it.
	AnnotationPrefix = "hami.io/"
	// AnnotationNodeInventory is on each Node. The device plugin writes it
	// (EncodeNodeInventory) at start and whenever a GPU's health or the
	// plugin's settings change, and only when the bytes change. The
	// scheduler extender reads it (ParseNodeInventory) on every Filter,
	// Score and Bind. A Node without it has no GPUs to offer.
	AnnotationNodeInventory = "hami.io/node-gpu-inventory"
	// LabelEnforcement is on each Node: the mechanism that enforces its
	// GPU slices (Enforcement), the same as the inventory's. The device
	// plugin sets it with the inventory; people and node selectors read
	// it. Missing means not reported.
	LabelEnforcement = "hami.io/enforcement"
	// LabelGPUReady is on each Node, "true" or "false" (EncodeReadyLabel).
	// The device plugin sets "true" once its Register RPC succeeded and
	// "false" when it loses registration (kubelet restart, socket gone) or
	// stops. It is the scheduling barrier: the extender (ParseReadyLabel)
	// and a node affinity the webhook adds admit a node only while it is
	// "true" and its heartbeat Lease is fresh. Missing means "false".
	LabelGPUReady = "hami.io/gpu.ready"
	// LabelNodeMode is on the Nodes of a DRA-mode pool, value NodeModeDRA:
	// the chart runs the DRA driver there and keeps the device plugin off
	// (dra.nodeSelector). A pod written with hami.io/* resources that
	// selects it in spec.nodeSelector is turned into a resource claim by the
	// webhook; one that selects another value is never turned.
	LabelNodeMode = "gpuslice.hami.io/mode"
	// NodeModeDRA is LabelNodeMode's value on DRA-mode nodes.
	NodeModeDRA = "dra"
	// AnnotationPluginHeartbeat is on the device plugin's heartbeat Lease
	// (coordination.k8s.io/v1, name HeartbeatLeaseName(node), namespace
	// DefaultHeartbeatNamespace unless configured). The plugin writes it
	// (EncodePluginHeartbeat) when its registration state changes and
	// renews the Lease's spec.renewTime on a timer; readers (the extender,
	// operators) treat the plugin as dead once renewTime plus
	// spec.leaseDurationSeconds has passed, whatever this says.
	AnnotationPluginHeartbeat = "hami.io/plugin-heartbeat"
	// LabelHeartbeat is on each device plugin's heartbeat Lease, always
	// LabelHeartbeatValue. The plugin sets it when it creates or renews the
	// Lease; the scheduler extender watches only Leases that carry it
	// (a label selector), so the kubelets' own node Leases in the same
	// namespace never reach its cache.
	LabelHeartbeat = "hami.io/gpu-heartbeat"
	// LabelHeartbeatValue is LabelHeartbeat's only value.
	LabelHeartbeatValue = "true"
	// AnnotationPodAllocation is on each Pod that asks for GPUs. The
	// scheduler extender writes it (EncodePodAllocation) in Bind, in the
	// metadata of the Binding it posts, which the API server copies onto
	// the pod with spec.nodeName; it never changes afterwards. The device plugin
	// reads it (ParsePodAllocation) when the kubelet allocates or starts the
	// pod's containers; the extender reads it to account for pods already
	// placed. Readers trust it only on a pod bound to the same node; the
	// webhook rejects pods that carry it at creation.
	AnnotationPodAllocation = "hami.io/gpu-allocation"
)

// Placement annotations a user may set on a Pod. Unlike the values above they
// are short plain strings a person writes, not versioned JSON; the webhook
// passes them through and the scheduler extender reads them all at once with
// ParseConstraints. A missing or empty annotation means no constraint (or the
// global default policy). docs/protocol.md describes each.
const (
	// AnnotationGPUModel restricts the pod to GPUs whose model contains one
	// of these comma-separated substrings, case-insensitive ("A100,H100").
	AnnotationGPUModel = "hami.io/gpu-model"
	// AnnotationGPUModelExclude keeps the pod off GPUs whose model contains
	// any of these comma-separated substrings, case-insensitive.
	AnnotationGPUModelExclude = "hami.io/gpu-model-exclude"
	// AnnotationGPUUUID restricts the pod to the GPUs with these
	// comma-separated UUIDs.
	AnnotationGPUUUID = "hami.io/gpu-uuid"
	// AnnotationGPUUUIDExclude keeps the pod off the GPUs with these
	// comma-separated UUIDs.
	AnnotationGPUUUIDExclude = "hami.io/gpu-uuid-exclude"
	// AnnotationNUMABind, "true" or "false", asks that all GPUs of each
	// container share one NUMA node.
	AnnotationNUMABind = "hami.io/numa-bind"
	// AnnotationNodePolicy overrides the global node policy for this pod:
	// "binpack", "spread" or "fragmentation" (Policy).
	AnnotationNodePolicy = "hami.io/node-policy"
	// AnnotationGPUPolicy overrides the global GPU policy (how GPUs are
	// chosen inside a node) for this pod; same values as
	// AnnotationNodePolicy.
	AnnotationGPUPolicy = "hami.io/gpu-policy"
	// AnnotationEnforcement asks that the pod's slices be enforced:
	// "required" admits only nodes whose mechanism guards every container
	// of the pod; "driver", "hami-core" or "mps" admits only nodes with
	// that mechanism. The same key as LabelEnforcement, on the Pod.
	AnnotationEnforcement = "hami.io/enforcement"
)

const (
	// Version1 is the first version of every value in this protocol.
	// Readers reject any version they do not know (ErrUnknownVersion); a
	// change to a value's fields or meaning is a new version constant, and
	// writers keep writing the old one until every reader knows the new.
	Version1 = 1
	// CurrentVersion is the version the Encode functions write.
	CurrentVersion = Version1
)

var (
	// ErrMalformed is wrapped by every Parse error about a value that is not
	// JSON, lacks a required field, has an unknown field or breaks a rule
	// (the type's Validate), and by ParseReadyLabel.
	ErrMalformed = errors.New("malformed value")
	// ErrUnknownVersion is wrapped by Parse errors about a well-formed value
	// whose version this reader does not know: the writer is newer.
	ErrUnknownVersion = errors.New("unknown version")
)

// EncodeNodeInventory returns the AnnotationNodeInventory value for n: compact
// JSON, the same bytes for equal inputs, GPUs in n's order. It fails when n
// breaks NodeInventory.Validate.
func EncodeNodeInventory(n NodeInventory) (string, error) {
	if err := n.Validate(); err != nil {
		return "", fmt.Errorf("encode %s: %w", AnnotationNodeInventory, err)
	}
	w := nodeInventoryV1{
		Version: CurrentVersion, Node: &n.Node, SplitCount: &n.SplitCount,
		MemoryScaling: &n.MemoryScaling, GPUs: make([]gpuV1, 0, len(n.GPUs)),
	}
	if n.Enforcement != "" {
		w.Enforcement = (*string)(&n.Enforcement)
	}
	for _, g := range n.GPUs {
		w.GPUs = append(w.GPUs, gpuV1{
			UUID: &g.UUID, Index: &g.Index, Minor: &g.Minor, Model: &g.Model,
			TotalMemoryMiB: &g.TotalMemoryMiB, SchedulableMemoryMiB: &g.SchedulableMemoryMiB,
			CoresPercent: &g.CoresPercent, NUMANode: &g.NUMANode, PCIBusID: &g.PCIBusID,
			Health: (*string)(&g.Health),
		})
	}
	return encode(AnnotationNodeInventory, w)
}

// ParseNodeInventory reads an AnnotationNodeInventory value. Any error wraps
// ErrMalformed or ErrUnknownVersion and comes with a zero NodeInventory.
func ParseNodeInventory(s string) (NodeInventory, error) {
	var w nodeInventoryV1
	if err := decode(s, &w); err != nil {
		return NodeInventory{}, fmt.Errorf("parse %s: %w", AnnotationNodeInventory, err)
	}
	var r required
	n := NodeInventory{
		Node:          need(&r, w.Node, "node"),
		SplitCount:    need(&r, w.SplitCount, "splitCount"),
		MemoryScaling: need(&r, w.MemoryScaling, "memoryScaling"),
	}
	if w.Enforcement != nil {
		n.Enforcement = Enforcement(*w.Enforcement)
	}
	r.slice(w.GPUs == nil, "gpus")
	if len(w.GPUs) > 0 {
		n.GPUs = make([]GPU, 0, len(w.GPUs))
	}
	for i, g := range w.GPUs {
		p := fmt.Sprintf("gpus[%d].", i)
		// Models and health repeat across GPUs and nodes: one copy each
		// (unique) for a scheduler that keeps thousands of inventories.
		n.GPUs = append(n.GPUs, GPU{
			UUID:                 need(&r, g.UUID, p+"uuid"),
			Index:                need(&r, g.Index, p+"index"),
			Minor:                need(&r, g.Minor, p+"minor"),
			Model:                unique.Make(need(&r, g.Model, p+"model")).Value(),
			TotalMemoryMiB:       need(&r, g.TotalMemoryMiB, p+"totalMemoryMiB"),
			SchedulableMemoryMiB: need(&r, g.SchedulableMemoryMiB, p+"schedulableMemoryMiB"),
			CoresPercent:         need(&r, g.CoresPercent, p+"coresPercent"),
			NUMANode:             need(&r, g.NUMANode, p+"numaNode"),
			PCIBusID:             need(&r, g.PCIBusID, p+"pciBusID"),
			Health:               Health(unique.Make(need(&r, g.Health, p+"health")).Value()),
		})
	}
	if err := r.check(n.Validate()); err != nil {
		return NodeInventory{}, fmt.Errorf("parse %s: %w", AnnotationNodeInventory, err)
	}
	return n, nil
}

// EncodeReadyLabel returns the LabelGPUReady value: "true" or "false".
func EncodeReadyLabel(ready bool) string {
	if ready {
		return "true"
	}
	return "false"
}

// ParseReadyLabel reads a LabelGPUReady value: exactly "true" or "false".
// Anything else, the empty string included, is an error wrapping
// ErrMalformed; callers treat a missing label as false without calling it.
func ParseReadyLabel(s string) (bool, error) {
	switch s {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("parse %s: %w: %q: must be \"true\" or \"false\"", LabelGPUReady, ErrMalformed, s)
}

// EncodePluginHeartbeat returns the AnnotationPluginHeartbeat value for h:
// compact JSON, RegisteredAt as RFC 3339 in UTC truncated to the second ("" when
// zero). It fails when h breaks PluginHeartbeat.Validate.
func EncodePluginHeartbeat(h PluginHeartbeat) (string, error) {
	if !h.RegisteredAt.IsZero() {
		h.RegisteredAt = h.RegisteredAt.UTC().Truncate(time.Second)
	}
	if err := h.Validate(); err != nil {
		return "", fmt.Errorf("encode %s: %w", AnnotationPluginHeartbeat, err)
	}
	at := ""
	if !h.RegisteredAt.IsZero() {
		at = h.RegisteredAt.Format(time.RFC3339)
	}
	return encode(AnnotationPluginHeartbeat, pluginHeartbeatV1{
		Version: CurrentVersion, Node: &h.Node, PluginVersion: &h.PluginVersion,
		ResourceName: &h.ResourceName, Registered: &h.Registered, RegisteredAt: &at, Socket: &h.Socket, Mode: h.Mode,
	})
}

// ParsePluginHeartbeat reads an AnnotationPluginHeartbeat value. registeredAt
// must be "" or exactly as EncodePluginHeartbeat writes it
// ("2026-01-02T15:04:05Z"). Any error wraps ErrMalformed or ErrUnknownVersion
// and comes with a zero PluginHeartbeat.
func ParsePluginHeartbeat(s string) (PluginHeartbeat, error) {
	var w pluginHeartbeatV1
	if err := decode(s, &w); err != nil {
		return PluginHeartbeat{}, fmt.Errorf("parse %s: %w", AnnotationPluginHeartbeat, err)
	}
	var r required
	h := PluginHeartbeat{
		Node:          need(&r, w.Node, "node"),
		PluginVersion: need(&r, w.PluginVersion, "pluginVersion"),
		ResourceName:  need(&r, w.ResourceName, "resourceName"),
		Registered:    need(&r, w.Registered, "registered"),
		Socket:        need(&r, w.Socket, "socket"),
		Mode:          w.Mode,
	}
	var errs []error
	if at := need(&r, w.RegisteredAt, "registeredAt"); at != "" {
		t, err := time.Parse(time.RFC3339, at)
		if err != nil || t.UTC().Format(time.RFC3339) != at {
			errs = append(errs, fmt.Errorf("registeredAt=%q: must be RFC 3339 in UTC to the second, e.g. 2026-01-02T15:04:05Z", at))
		}
		h.RegisteredAt = t.UTC()
	}
	errs = append(errs, h.Validate())
	if err := r.check(errors.Join(errs...)); err != nil {
		return PluginHeartbeat{}, fmt.Errorf("parse %s: %w", AnnotationPluginHeartbeat, err)
	}
	return h, nil
}

// EncodePodAllocation returns the AnnotationPodAllocation value for a:
// compact JSON, the same bytes for equal inputs, containers and slices in a's
// order. It fails when a breaks PodAllocation.Validate or the value would be
// longer than MaxPodAllocationLength, which ParsePodAllocation refuses.
func EncodePodAllocation(a PodAllocation) (string, error) {
	if err := a.Validate(); err != nil {
		return "", fmt.Errorf("encode %s: %w", AnnotationPodAllocation, err)
	}
	w := podAllocationV1{Version: CurrentVersion, Node: &a.Node, Containers: make([]containerAllocationV1, 0, len(a.Containers))}
	for _, c := range a.Containers {
		wc := containerAllocationV1{Name: &c.Name, Init: &c.Init, GPUs: make([]gpuSliceV1, 0, len(c.GPUs))}
		for _, s := range c.GPUs {
			wc.GPUs = append(wc.GPUs, gpuSliceV1{UUID: &s.UUID, MemoryMiB: &s.MemoryMiB, CoresPercent: &s.CoresPercent})
		}
		w.Containers = append(w.Containers, wc)
	}
	v, err := encode(AnnotationPodAllocation, w)
	if err == nil && len(v) > MaxPodAllocationLength {
		return "", fmt.Errorf("encode %s: %d bytes: must be at most %d", AnnotationPodAllocation, len(v), MaxPodAllocationLength)
	}
	return v, err
}

// ParsePodAllocation reads an AnnotationPodAllocation value of at most
// MaxPodAllocationLength bytes; a longer one is malformed before it is
// decoded. Any error wraps ErrMalformed or ErrUnknownVersion and comes with a
// zero PodAllocation.
func ParsePodAllocation(s string) (PodAllocation, error) {
	if len(s) > MaxPodAllocationLength {
		return PodAllocation{}, fmt.Errorf("parse %s: %w: %d bytes: must be at most %d", AnnotationPodAllocation, ErrMalformed, len(s), MaxPodAllocationLength)
	}
	var w podAllocationV1
	if err := decode(s, &w); err != nil {
		return PodAllocation{}, fmt.Errorf("parse %s: %w", AnnotationPodAllocation, err)
	}
	// What is decoded is converted and checked field by field only within
	// the counts a request may ask for.
	err := tooManyContainers(len(w.Containers))
	for i := 0; i < len(w.Containers) && err == nil; i++ {
		if n := len(w.Containers[i].GPUs); n > MaxGPUsPerContainer {
			err = tooManySlices(i, n)
		}
	}
	if err != nil {
		return PodAllocation{}, fmt.Errorf("parse %s: %w: %w", AnnotationPodAllocation, ErrMalformed, err)
	}
	var r required
	a := PodAllocation{Node: need(&r, w.Node, "node")}
	r.slice(w.Containers == nil, "containers")
	for i, c := range w.Containers {
		p := fmt.Sprintf("containers[%d].", i)
		ca := ContainerAllocation{Name: need(&r, c.Name, p+"name"), Init: need(&r, c.Init, p+"init")}
		r.slice(c.GPUs == nil, p+"gpus")
		for k, s := range c.GPUs {
			sp := fmt.Sprintf("%sgpus[%d].", p, k)
			ca.GPUs = append(ca.GPUs, GPUSlice{
				UUID:         need(&r, s.UUID, sp+"uuid"),
				MemoryMiB:    need(&r, s.MemoryMiB, sp+"memoryMiB"),
				CoresPercent: need(&r, s.CoresPercent, sp+"coresPercent"),
			})
		}
		a.Containers = append(a.Containers, ca)
	}
	if err := r.check(a.Validate()); err != nil {
		return PodAllocation{}, fmt.Errorf("parse %s: %w", AnnotationPodAllocation, err)
	}
	return a, nil
}

// Wire forms, version 1. Every field is required unless marked optional:
// pointers and nil slices tell a missing (or null) field from a zero one.
// Field names are frozen.

type nodeInventoryV1 struct {
	Version       int      `json:"version"`
	Node          *string  `json:"node"`
	SplitCount    *int     `json:"splitCount"`
	MemoryScaling *float64 `json:"memoryScaling"`
	// Enforcement is optional: inventories written before it existed lack
	// it, and read as the empty Enforcement.
	Enforcement *string `json:"enforcement,omitempty"`
	GPUs        []gpuV1 `json:"gpus"`
}

type gpuV1 struct {
	UUID                 *string `json:"uuid"`
	Index                *int    `json:"index"`
	Minor                *int    `json:"minor"`
	Model                *string `json:"model"`
	TotalMemoryMiB       *int64  `json:"totalMemoryMiB"`
	SchedulableMemoryMiB *int64  `json:"schedulableMemoryMiB"`
	CoresPercent         *int    `json:"coresPercent"`
	NUMANode             *int    `json:"numaNode"`
	PCIBusID             *string `json:"pciBusID"`
	Health               *string `json:"health"`
}

type pluginHeartbeatV1 struct {
	Version       int     `json:"version"`
	Node          *string `json:"node"`
	PluginVersion *string `json:"pluginVersion"`
	ResourceName  *string `json:"resourceName"`
	Registered    *bool   `json:"registered"`
	RegisteredAt  *string `json:"registeredAt"`
	Socket        *string `json:"socket"`
	// Mode is optional: absent is the device plugin.
	Mode string `json:"mode,omitempty"`
}

type podAllocationV1 struct {
	Version    int                     `json:"version"`
	Node       *string                 `json:"node"`
	Containers []containerAllocationV1 `json:"containers"`
}

type containerAllocationV1 struct {
	Name *string      `json:"name"`
	Init *bool        `json:"init"`
	GPUs []gpuSliceV1 `json:"gpus"`
}

type gpuSliceV1 struct {
	UUID         *string `json:"uuid"`
	MemoryMiB    *int64  `json:"memoryMiB"`
	CoresPercent *int    `json:"coresPercent"`
}

func encode(key string, w any) (string, error) {
	b, err := json.Marshal(w)
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", key, err)
	}
	return string(b), nil
}

// decode checks that s is one JSON object with a known "version", then
// decodes it into w, rejecting unknown fields.
func decode(s string, w any) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &fields); err != nil {
		return fmt.Errorf("%w: not a JSON object: %w", ErrMalformed, err)
	}
	if fields == nil {
		return fmt.Errorf("%w: not a JSON object: null", ErrMalformed)
	}
	raw, ok := fields["version"]
	if !ok {
		return fmt.Errorf("%w: missing required field \"version\"", ErrMalformed)
	}
	var version int
	if err := json.Unmarshal(raw, &version); err != nil || string(raw) == "null" {
		return fmt.Errorf("%w: version=%s: must be an integer", ErrMalformed, raw)
	}
	if version != Version1 {
		return fmt.Errorf("%w: version=%d: this reader knows version %d only", ErrUnknownVersion, version, Version1)
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(w); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

// required collects the paths of missing fields while a wire form is
// converted.
type required struct{ missing []string }

func need[T any](r *required, p *T, path string) T {
	if p == nil {
		r.missing = append(r.missing, path)
		var zero T
		return zero
	}
	return *p
}

func (r *required) slice(missing bool, path string) {
	if missing {
		r.missing = append(r.missing, path)
	}
}

// maxShownMissing bounds the missing fields an error names; the rest are
// counted.
const maxShownMissing = 16

// check returns nil when no field is missing and invalid is nil; else an
// error wrapping ErrMalformed. Missing fields are reported alone, as the
// zero values they leave would only add noise, the first maxShownMissing
// by path and the rest counted.
func (r *required) check(invalid error) error {
	if n := len(r.missing); n > maxShownMissing {
		return fmt.Errorf("%w: missing required fields: %s and %d more", ErrMalformed, strings.Join(r.missing[:maxShownMissing], ", "), n-maxShownMissing)
	}
	if len(r.missing) > 0 {
		return fmt.Errorf("%w: missing required fields: %s", ErrMalformed, strings.Join(r.missing, ", "))
	}
	if invalid != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, invalid)
	}
	return nil
}

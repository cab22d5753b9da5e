package cluster

import (
	"errors"
	"fmt"
	"hash/maphash"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"
)

// NodeMeta is what the Node cache keeps of a Node: its identity and what
// upsertNodeMeta reads, with the inventory annotation already parsed. The
// annotation itself (about 1.7 KB for 8 GPUs) is kept nowhere: a hash of
// it tells whether the next event changed it, and while it did not, the
// parse is the one the node's state already holds, shared rather than
// repeated. Like podMeta it is a runtime.Object only to live in the
// informer's store, and keeps its identity in plain fields.
type NodeMeta struct {
	Name            string
	UID             types.UID
	ResourceVersion string
	// ReadyLabel is the vgpu.LabelGPUReady label, HasReadyLabel whether
	// the Node has it.
	ReadyLabel    string
	HasReadyLabel bool
	// HasInventory is whether the Node has the inventory annotation;
	// InventoryHash is inventoryHash of its value, Inventory and
	// InventoryErr its parse (ErrNoInventory without it; an inventory
	// that names another node is an error).
	HasInventory  bool
	InventoryHash uint64
	Inventory     vgpu.NodeInventory
	InventoryErr  error
	// Allocatable is the Node's allocatable GPU resource (0 when absent);
	// HostAllocatable its allocatable CPU and memory (hostAllocatableOf).
	Allocatable     int64
	HostAllocatable *vgpu.HostResources
	// Registered is the vgpu.ConditionRegistered condition, status and
	// reason only (nil without one); KubeletReady whether Ready is True.
	Registered   *corev1.NodeCondition
	KubeletReady bool
}

// GetObjectKind is that of an object without type information.
func (m *NodeMeta) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies m; the parsed inventory, never modified once
// parsed, is shared.
func (m *NodeMeta) DeepCopyObject() runtime.Object {
	c := *m
	return &c
}

// GetObjectMeta returns m's identity as an ObjectMeta, built on each call.
func (m *NodeMeta) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion}
}

// inventorySeed seeds inventoryHash for the life of the process.
var inventorySeed = maphash.MakeSeed()

// inventoryHash identifies an inventory annotation value: two values with
// the same hash are taken to be the same (a 64-bit collision between two
// versions of one node's annotation is too unlikely to matter).
func inventoryHash(raw string) uint64 { return maphash.String(inventorySeed, raw) }

// InventoryReuse returns the parse the state already holds for node name
// when its inventory annotation is the one of hash (has: the Node has the
// annotation), and false when it holds none for it.
type InventoryReuse func(name string, hash uint64, has bool) (vgpu.NodeInventory, error, bool)

// NodeMetaOf is node as the Node cache keeps it, judged for resource;
// the inventory is parsed unless reuse (nil: none) holds its parse.
func NodeMetaOf(node *corev1.Node, resource corev1.ResourceName, reuse InventoryReuse) *NodeMeta {
	m := &NodeMeta{Name: node.Name, UID: node.UID, ResourceVersion: node.ResourceVersion}
	m.ReadyLabel, m.HasReadyLabel = node.Labels[vgpu.LabelGPUReady]
	raw, has := node.Annotations[vgpu.AnnotationNodeInventory]
	m.HasInventory = has
	switch {
	case !has:
		m.InventoryErr = vgpu.ErrNoInventory
	default:
		m.InventoryHash = inventoryHash(raw)
		if reuse != nil {
			if inv, err, ok := reuse(node.Name, m.InventoryHash, true); ok {
				m.Inventory, m.InventoryErr = inv, err
				break
			}
		}
		inv, err := vgpu.ParseNodeInventory(raw)
		if err == nil && inv.Node != node.Name {
			err = fmt.Errorf("%s names node %q", vgpu.AnnotationNodeInventory, inv.Node)
			inv = vgpu.NodeInventory{}
		}
		m.Inventory, m.InventoryErr = inv, err
	}
	if q, ok := node.Status.Allocatable[resource]; ok {
		m.Allocatable = q.Value()
	}
	m.HostAllocatable = hostAllocatableOf(node)
	for _, c := range node.Status.Conditions {
		switch c.Type {
		case vgpu.ConditionRegistered:
			m.Registered = &corev1.NodeCondition{Type: c.Type, Status: c.Status, Reason: c.Reason}
		case corev1.NodeReady:
			m.KubeletReady = c.Status == corev1.ConditionTrue
		}
	}
	return m
}

// ParsedInventory is the state's InventoryReuse: the inventory its node
// holds, while the annotation is the one it was parsed from.
func (st *State) ParsedInventory(name string, hash uint64, has bool) (vgpu.NodeInventory, error, bool) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	n := st.nodes[name]
	if n == nil || !n.known || n.hasInventory != has || n.inventoryHash != hash || errors.Is(n.inventoryErr, vgpu.ErrNoInventory) {
		return vgpu.NodeInventory{}, nil, false
	}
	return n.inventory, n.inventoryErr, true
}

package vgputest

import (
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"
)

// NodeObjectBuilder builds a *corev1.Node as the device plugin publishes it
// (inventory annotation, ready label, allocatable). Start with NodeObject or
// PublishedNode.
type NodeObjectBuilder struct {
	node corev1.Node
}

// NodeObject starts a Node named name with UID "uid-"+name and nothing
// published: no inventory, no ready label, no allocatable GPUs.
func NodeObject(name string) *NodeObjectBuilder {
	return &NodeObjectBuilder{node: corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, UID: types.UID("uid-" + name),
	}}}
}

// PublishedNode starts the Node of inv as a healthy, registered device
// plugin leaves it: inv as the inventory annotation, the ready label "true"
// and allocatable hami.io/gpu of SplitCount per healthy GPU.
func PublishedNode(inv vgpu.NodeInventory) *NodeObjectBuilder {
	return NodeObject(inv.Node).Inventory(inv).Ready(true).
		Allocatable(vgpu.ResourceGPU, int64(inv.SplitCount*inv.Healthy()))
}

// Inventory sets the inventory annotation to inv, encoded. An inventory
// that vgpu cannot encode is a mistake in the test and panics; use
// Annotation for malformed values.
func (b *NodeObjectBuilder) Inventory(inv vgpu.NodeInventory) *NodeObjectBuilder {
	s, err := vgpu.EncodeNodeInventory(inv)
	if err != nil {
		panic(err)
	}
	return b.Annotation(vgpu.AnnotationNodeInventory, s)
}

// Annotation sets an annotation.
func (b *NodeObjectBuilder) Annotation(key, value string) *NodeObjectBuilder {
	if b.node.Annotations == nil {
		b.node.Annotations = map[string]string{}
	}
	b.node.Annotations[key] = value
	return b
}

// Ready sets the ready label to "true" or "false".
func (b *NodeObjectBuilder) Ready(ready bool) *NodeObjectBuilder {
	return b.Label(vgpu.LabelGPUReady, vgpu.EncodeReadyLabel(ready))
}

// Label sets a label.
func (b *NodeObjectBuilder) Label(key, value string) *NodeObjectBuilder {
	if b.node.Labels == nil {
		b.node.Labels = map[string]string{}
	}
	b.node.Labels[key] = value
	return b
}

// WithoutLabel removes a label.
func (b *NodeObjectBuilder) WithoutLabel(key string) *NodeObjectBuilder {
	delete(b.node.Labels, key)
	return b
}

// WithoutAnnotation removes an annotation.
func (b *NodeObjectBuilder) WithoutAnnotation(key string) *NodeObjectBuilder {
	delete(b.node.Annotations, key)
	return b
}

// Allocatable sets status.allocatable and status.capacity of name to n.
func (b *NodeObjectBuilder) Allocatable(name corev1.ResourceName, n int64) *NodeObjectBuilder {
	if b.node.Status.Allocatable == nil {
		b.node.Status.Allocatable = corev1.ResourceList{}
	}
	if b.node.Status.Capacity == nil {
		b.node.Status.Capacity = corev1.ResourceList{}
	}
	b.node.Status.Allocatable[name] = *resource.NewQuantity(n, resource.DecimalSI)
	b.node.Status.Capacity[name] = *resource.NewQuantity(n, resource.DecimalSI)
	return b
}

// Condition sets the status condition of type t (replacing one of that
// type) with status and reason.
func (b *NodeObjectBuilder) Condition(t corev1.NodeConditionType, status corev1.ConditionStatus, reason string) *NodeObjectBuilder {
	c := corev1.NodeCondition{Type: t, Status: status, Reason: reason}
	for i := range b.node.Status.Conditions {
		if b.node.Status.Conditions[i].Type == t {
			b.node.Status.Conditions[i] = c
			return b
		}
	}
	b.node.Status.Conditions = append(b.node.Status.Conditions, c)
	return b
}

// Obj returns a deep copy of the Node built so far.
func (b *NodeObjectBuilder) Obj() *corev1.Node {
	return b.node.DeepCopy()
}

// LeaseBuilder builds the device plugin's heartbeat Lease. Start with
// HeartbeatLease.
type LeaseBuilder struct {
	lease coordinationv1.Lease
}

// HeartbeatLease starts the heartbeat Lease of node in
// vgpu.DefaultHeartbeatNamespace, named vgpu.HeartbeatLeaseName(node),
// holding a heartbeat that says the plugin registered hami.io/gpu at
// renewed, renewed at renewed and lasting 40 s.
func HeartbeatLease(node string, renewed time.Time) *LeaseBuilder {
	b := &LeaseBuilder{lease: coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: vgpu.HeartbeatLeaseName(node), Namespace: vgpu.DefaultHeartbeatNamespace,
		Labels: map[string]string{vgpu.LabelHeartbeat: vgpu.LabelHeartbeatValue},
	}}}
	holder := "gpuslice-device-plugin/" + node
	seconds := int32(40)
	b.lease.Spec.HolderIdentity = &holder
	b.lease.Spec.LeaseDurationSeconds = &seconds
	b.RenewedAt(renewed)
	return b.Heartbeat(vgpu.PluginHeartbeat{
		Node: node, PluginVersion: "test", ResourceName: string(vgpu.ResourceGPU),
		Registered: true, RegisteredAt: renewed.UTC().Truncate(time.Second),
		Socket: "gpuslice-" + strconv.FormatInt(renewed.Unix(), 10) + ".sock",
	})
}

// Namespace sets the Lease's namespace.
func (b *LeaseBuilder) Namespace(ns string) *LeaseBuilder {
	b.lease.Namespace = ns
	return b
}

// RenewedAt sets spec.renewTime; a zero t removes it.
func (b *LeaseBuilder) RenewedAt(t time.Time) *LeaseBuilder {
	if t.IsZero() {
		b.lease.Spec.RenewTime = nil
		return b
	}
	mt := metav1.NewMicroTime(t)
	b.lease.Spec.RenewTime = &mt
	return b
}

// Heartbeat sets the heartbeat annotation to h, encoded. A heartbeat that
// vgpu cannot encode is a mistake in the test and panics; use Annotation
// for malformed values.
func (b *LeaseBuilder) Heartbeat(h vgpu.PluginHeartbeat) *LeaseBuilder {
	s, err := vgpu.EncodePluginHeartbeat(h)
	if err != nil {
		panic(err)
	}
	return b.Annotation(vgpu.AnnotationPluginHeartbeat, s)
}

// Annotation sets an annotation; an empty value removes it.
func (b *LeaseBuilder) Annotation(key, value string) *LeaseBuilder {
	if value == "" {
		delete(b.lease.Annotations, key)
		return b
	}
	if b.lease.Annotations == nil {
		b.lease.Annotations = map[string]string{}
	}
	b.lease.Annotations[key] = value
	return b
}

// Obj returns a deep copy of the Lease built so far.
func (b *LeaseBuilder) Obj() *coordinationv1.Lease {
	return b.lease.DeepCopy()
}

package retry

import "github.com/gpuslice/gpuslice/vgpu"

// Class groups Filter's reasons by what can cure them.
type Class uint8

// The classes, the least hopeful first.
const (
	// ClassNotReady: the plugin does not serve the node, or the node is
	// unknown (the extender's own reasons, and any reason not below).
	ClassNotReady Class = iota
	// ClassInventory: too few healthy GPUs of the wanted model or UUID.
	ClassInventory
	// ClassCapacity: slices, memory, cores or NUMA: room that pods hold.
	ClassCapacity
	// Classes is how many classes there are.
	Classes
)

// classOf is the rejection class of a verdict's reason.
func classOf(r vgpu.Reason) Class {
	switch r {
	case vgpu.ReasonUnhealthy, vgpu.ReasonModel, vgpu.ReasonUUID, vgpu.ReasonEnforcement:
		return ClassInventory
	case vgpu.ReasonNoFreeSlice, vgpu.ReasonInsufficientMemory, vgpu.ReasonInsufficientCores, vgpu.ReasonNUMA:
		return ClassCapacity
	}
	return ClassNotReady
}

// nodeSet is a set of node indexes.
type nodeSet []uint64

func (b *nodeSet) add(i int) {
	for len(*b) <= i/64 {
		*b = append(*b, 0)
	}
	(*b)[i/64] |= 1 << (i % 64)
}

func (b nodeSet) has(i int) bool { return i/64 < len(b) && b[i/64]&(1<<(i%64)) != 0 }

// Rejection is what one Filter turned a pod away for: the nodes, by index
// in the cluster state, of each class of reason, and whether some node
// could not be judged. The zero value turned the pod away from no node.
// Not safe for concurrent use; Tracker.Rejected keeps its own copy.
type Rejection struct {
	nodes [Classes]nodeSet
	// Unjudged is set when some node was turned away before it could be
	// judged (unknown to the cache, or the caches not synced yet): a
	// change on any node may then cure the pod.
	Unjudged bool
	// Elsewhere is set when a node the Filter was not asked about fits
	// the pod now (kube-scheduler sent a sample): it is due at the next
	// pass, whatever changed.
	Elsewhere bool
}

// Add records that the node with index node turned the pod away for
// reason. node must not be negative.
func (r *Rejection) Add(node int, reason vgpu.Reason) {
	r.nodes[classOf(reason)].add(node)
}

// Judged reports whether the node with index node turned the pod away.
func (r *Rejection) Judged(node int) bool {
	for _, set := range r.nodes {
		if set.has(node) {
			return true
		}
	}
	return false
}

// Class is the most hopeful class among the reasons that turned the pod
// away: ClassCapacity when some node lacks only room, else ClassInventory
// when some node lacks the wanted GPUs, else ClassNotReady (also for a
// rejection with no judged node).
func (r *Rejection) Class() Class {
	switch {
	case len(r.nodes[ClassCapacity]) > 0:
		return ClassCapacity
	case len(r.nodes[ClassInventory]) > 0:
		return ClassInventory
	}
	return ClassNotReady
}

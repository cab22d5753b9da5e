package cluster

import (
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Registration is what the node-condition controller knows of one node.
type Registration struct {
	Name string
	// Condition is the Node's vgpu.ConditionRegistered (status and reason).
	Condition    corev1.NodeCondition
	Allocatable  int64
	KubeletReady bool
	// HasLease is true while the heartbeat Lease exists; RenewTime is its
	// renewTime (zero when unset).
	HasLease  bool
	RenewTime time.Time
	// DRA is true when the heartbeat is a DRA driver's (vgpu.NodeModeDRA):
	// its node has no allocatable extended resource to judge.
	DRA bool
}

// Registrations returns the known nodes that carry vgpu.ConditionRegistered,
// sorted by name.
func (st *State) Registrations() []Registration {
	st.mu.RLock()
	defer st.mu.RUnlock()
	var out []Registration
	for _, n := range st.byIndex {
		if !n.known || n.registered == nil {
			continue
		}
		r := Registration{Name: n.name, Condition: *n.registered, Allocatable: n.allocatable, KubeletReady: n.kubeletReady}
		if n.lease != nil {
			r.HasLease, r.RenewTime = true, n.lease.renewTime
			r.DRA = n.lease.heartbeatErr == nil && n.lease.heartbeat.Mode == vgpu.NodeModeDRA
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Registration) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// GPUSample is one GPU's figures, copied under the state's read lock.
type GPUSample struct {
	Node, GPU string
	// MemoryMiB, CoresPercent and Slices are what the counted pods hold
	// of it; SchedulableMemMiB is its inventory's schedulable memory.
	MemoryMiB         int64
	CoresPercent      int
	Slices            int
	SchedulableMemMiB int64
}

// GPUSamples returns the figures of every GPU in the inventory of every
// Node that exists and published a valid one, by node name and then in
// inventory order.
func (st *State) GPUSamples() []GPUSample {
	st.mu.RLock()
	defer st.mu.RUnlock()
	names := make([]string, 0, len(st.nodes))
	count := 0
	for name, n := range st.nodes {
		if n.known && n.inventoryErr == nil {
			names = append(names, name)
			count += len(n.inventory.GPUs)
		}
	}
	slices.Sort(names)
	out := make([]GPUSample, 0, count)
	for _, name := range names {
		n := st.nodes[name]
		for _, g := range n.inventory.GPUs {
			u := n.usage.GPU(g.UUID)
			out = append(out, GPUSample{
				Node: name, GPU: g.UUID,
				MemoryMiB: u.MemoryMiB, CoresPercent: u.CoresPercent, Slices: u.Slices,
				SchedulableMemMiB: g.SchedulableMemoryMiB,
			})
		}
	}
	return out
}

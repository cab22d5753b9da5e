package cluster

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// What follows reads or holds the state for tests, benchmarks and
// debugging; the extender's verbs never call it.

// Summary returns node's summary (nil for a node the state does not
// know). It is never modified once built.
func (st *State) Summary(node string) *vgpu.NodeSummary {
	st.mu.RLock()
	defer st.mu.RUnlock()
	if n := st.nodes[node]; n != nil {
		return n.summary
	}
	return nil
}

// Workload returns what the summaries are measured against now.
func (st *State) Workload() *vgpu.Workload {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.workload
}

// Known calls fn(i) for each of names the state has a node for, under one
// read lock.
func (st *State) Known(names []string, fn func(i int)) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	for i, name := range names {
		if st.nodes[name] != nil {
			fn(i)
		}
	}
}

// Fitted returns how many nodes hold a verdict of d's shape for their
// current generation that a fit found (not a bound).
func (st *State) Fitted(d *Demand) int {
	st.mu.RLock()
	defer st.mu.RUnlock()
	fitted := 0
	for _, n := range st.byIndex {
		if v, ok := n.verdicts.get(d.Key, n.gen); ok && !v.Bounded {
			fitted++
		}
	}
	return fitted
}

// ForgetVerdicts empties every node's remembered verdicts, so that the
// next pod of any shape is judged cold.
func (st *State) ForgetVerdicts() {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, n := range st.byIndex {
		n.verdicts = verdictCache{}
	}
}

// Stall holds the state's write lock until resume is called, as an
// informer's update or a new workload's rebuild does, for tests that prove
// a caller answers without waiting for the state.
func (st *State) Stall() (resume func()) {
	st.mu.Lock()
	return st.mu.Unlock
}

// NodeView is a copy of what the state holds of one node.
type NodeView struct {
	Known bool
	// Gen changes whenever the node's usage or inventory does.
	Gen uint64
	// HasInventory, InventoryHash, Inventory and InventoryErr are the
	// inventory annotation's, as NodeMeta has them.
	HasInventory  bool
	InventoryHash uint64
	Inventory     vgpu.NodeInventory
	InventoryErr  error
	// Readiness is what the Node's own fields say of its plugin.
	Readiness vgpu.Readiness
	// HostAllocatable is the Node's allocatable CPU and memory and
	// HostFree what is free of them (nil while unknown).
	HostAllocatable, HostFree *vgpu.HostResources
	// Registered is the Node's registration condition (status and reason;
	// nil without one); KubeletReady whether its Ready condition is True.
	Registered   *corev1.NodeCondition
	KubeletReady bool
}

// Node returns a view of node name, false when the state has none.
func (st *State) Node(name string) (NodeView, bool) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	n := st.nodes[name]
	if n == nil {
		return NodeView{}, false
	}
	return NodeView{
		Known: n.known, Gen: n.gen,
		HasInventory: n.hasInventory, InventoryHash: n.inventoryHash, Inventory: n.inventory, InventoryErr: n.inventoryErr,
		Readiness: n.readiness, HostAllocatable: n.hostAllocatable, HostFree: n.hostFreeLocked(),
		Registered: n.registered, KubeletReady: n.kubeletReady,
	}, true
}

// Counted returns how many pods count GPU usage (bound or reserved) and
// how many count CPU and memory on some node.
func (st *State) Counted() (pods, hosts int) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return len(st.pods), len(st.hosts)
}

// Remembered returns the verdict node name remembers for d's shape at its
// current generation, false when it remembers none.
func (st *State) Remembered(name string, d *Demand) (Verdict, bool) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	if n := st.nodes[name]; n != nil {
		return n.verdicts.get(d.Key, n.gen)
	}
	return Verdict{}, false
}

// MeasuredAgainst reports whether w is the workload and every node's
// summary is measured against it.
func (st *State) MeasuredAgainst(w *vgpu.Workload) bool {
	st.mu.RLock()
	defer st.mu.RUnlock()
	if st.workload != w {
		return false
	}
	for _, n := range st.byIndex {
		if n.summaryWorkload != w {
			return false
		}
	}
	return true
}

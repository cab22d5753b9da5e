package cluster

import "github.com/gpuslice/gpuslice/vgpu"

// refreshChunk is how many node summaries a new snapshot rebuilds per hold
// of the state's write lock, so Filter waits for a chunk, not for every
// node.
const refreshChunk = 256

// SetWorkload makes w, which no one else writes, what Fit measures
// fragmentation against, with the cluster's healthy GPUs by model as its
// supply, and rebuilds the node summaries for it a chunk at a time. Until
// a node's summary is rebuilt, Fit measures that node afresh against w
// (judgeLocked), with the same result.
func (st *State) SetWorkload(w *vgpu.Workload) {
	st.mu.RLock()
	supply := map[string]int{}
	for _, n := range st.byIndex {
		if !n.known {
			continue
		}
		for _, g := range n.inventory.GPUs {
			if g.Health == vgpu.Healthy {
				supply[g.Model]++
			}
		}
	}
	st.mu.RUnlock()
	if st.opts.ExtraSupply != nil {
		for model, n := range st.opts.ExtraSupply() {
			supply[model] += n
		}
	}
	w.SetSupply(supply)
	st.mu.Lock()
	st.workload = w
	nodes := len(st.byIndex)
	st.mu.Unlock()
	for start := 0; start < nodes; start += refreshChunk {
		st.mu.Lock()
		if st.workload != w {
			st.mu.Unlock()
			return // a newer snapshot rebuilds them
		}
		for _, n := range st.byIndex[start:min(start+refreshChunk, len(st.byIndex))] {
			if n.summaryWorkload != w {
				st.refreshLocked(n)
			}
		}
		st.mu.Unlock()
	}
}

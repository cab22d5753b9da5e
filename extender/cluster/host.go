package cluster

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"
)

// hostEntry is one pod's share of its node's CPU and memory.
type hostEntry struct {
	node string
	req  vgpu.HostResources
}

// upsertHost records what pod uid takes of node's CPU and memory: req while
// it is bound there and not terminal (node "" or terminal: nothing). A
// change refreshes the nodes concerned; most pod events change nothing and
// take only the read lock.
func (st *State) upsertHost(uid types.UID, node string, isTerminal bool, req vgpu.HostResources) {
	want := hostEntry{node: node, req: req}
	counts := node != "" && !isTerminal && req != (vgpu.HostResources{})
	st.mu.RLock()
	old, had := st.hosts[uid]
	st.mu.RUnlock()
	if had == counts && (!counts || old == want) {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.setHostLocked(uid, want, counts)
}

// setHostLocked replaces uid's host entry by want (none when !counts).
// Callers hold the write lock.
func (st *State) setHostLocked(uid types.UID, want hostEntry, counts bool) {
	if n := st.replaceHostLocked(uid, want, counts); n != nil {
		st.refreshLocked(n)
	}
}

// ReserveHost counts req on node for pod uid, which Bind is binding there,
// unless the pod is counted already, and returns what undoes it: the
// entry is removed unless the informer replaced it meanwhile.
func (st *State) ReserveHost(uid types.UID, node string, req vgpu.HostResources) (undo func()) {
	want := hostEntry{node: node, req: req}
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, had := st.hosts[uid]; had || req == (vgpu.HostResources{}) {
		return func() {}
	}
	st.setHostLocked(uid, want, true)
	return func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		if got, ok := st.hosts[uid]; ok && got == want {
			st.setHostLocked(uid, hostEntry{}, false)
		}
	}
}

// replaceHostLocked is setHostLocked but for the last refresh: it returns
// the node whose summary the change left stale (nil: none), for a caller
// that changes more of that node before refreshing it once. Callers hold
// the write lock.
func (st *State) replaceHostLocked(uid types.UID, want hostEntry, counts bool) *nodeState {
	var stale *nodeState
	if old, ok := st.hosts[uid]; ok {
		if counts && old == want {
			return nil
		}
		stale = st.nodes[old.node]
		stale.hostRequested = stale.hostRequested.Minus(old.req)
		delete(st.hosts, uid)
	}
	if !counts {
		return stale
	}
	n := st.nodeLocked(want.node)
	if stale != nil && stale != n {
		st.refreshLocked(stale)
	}
	n.hostRequested.CPUMilli += want.req.CPUMilli
	n.hostRequested.MemoryMiB += want.req.MemoryMiB
	st.hosts[uid] = want
	return n
}

// hostFreeLocked is n's allocatable CPU and memory less what its pods
// request, or nil while its Node's allocatable CPU is unknown. Callers hold
// st.mu.
func (n *nodeState) hostFreeLocked() *vgpu.HostResources {
	if n.hostAllocatable == nil {
		return nil
	}
	free := n.hostAllocatable.Minus(n.hostRequested)
	return &free
}

// ReadHosts runs fn under st.mu's read lock with the workload and each
// node's free CPU and memory (hostFreeLocked; nil for a node st does not
// know): drascore.HostReader, for the DRA scoring, which calls it with its
// own lock held. fn must not take st.mu.
func (st *State) ReadHosts(fn func(w *vgpu.Workload, hostFree func(node string) *vgpu.HostResources)) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	fn(st.workload, func(node string) *vgpu.HostResources {
		if n := st.nodes[node]; n != nil {
			return n.hostFreeLocked()
		}
		return nil
	})
}

// hostAllocatableOf reads a Node's allocatable CPU and memory (MiB, rounded
// down); nil when it has no allocatable CPU (a Node not yet reported by its
// kubelet).
func hostAllocatableOf(node *corev1.Node) *vgpu.HostResources {
	if _, ok := node.Status.Allocatable[corev1.ResourceCPU]; !ok {
		return nil
	}
	a := vgpu.HostResources{CPUMilli: node.Status.Allocatable.Cpu().MilliValue(), MemoryMiB: node.Status.Allocatable.Memory().Value() >> 20}
	return &a
}

package cluster

import (
	"fmt"
	"sync"
	"time"

	"github.com/gpuslice/gpuslice/vgpu"
)

// BusyError is Reserve's error for a pod that is counted as reserved
// already: a bind of it is in progress, or one had an unknown outcome.
type BusyError struct {
	// Entry is the pod's reservation.
	Entry *Entry
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("a bind of this pod to node %s is already in progress", e.Entry.node)
}

// Reserve fits d, a pod that asks for GPUs, on node and counts it there as
// a reservation, which counts until the informer sees the pod bound with
// it (it then counts as bound), finished or deleted, or Release drops it.
// It holds the node's bind lock throughout, so binds to one node reserve
// one at a time; binds to different nodes do not wait on each other. The
// fit itself runs under the state's read lock and is repeated under the
// write lock only if the node's usage changed in between. The error wraps
// a *vgpu.FitError when the pod does not fit, and is a *BusyError when the
// pod is reserved already.
func (st *State) Reserve(node string, d *Demand) (*Entry, error) {
	unlock := st.bindLocks.lock(node)
	defer unlock()
	now := st.now()
	st.mu.RLock()
	v, gen, err := st.checkLocked(node, d, now)
	st.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.nodes[node].gen != gen {
		if v, _, err = st.checkLocked(node, d, now); err != nil {
			return nil, err
		}
	}
	raw, err := vgpu.EncodePodAllocation(*v.Allocation)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	st.removeLocked(st.pods[d.UID]) // a stale count of this pod
	e := &Entry{
		uid: d.UID, node: node,
		raw: raw, alloc: *v.Allocation, req: d.Pod.Request, reserved: true,
	}
	// The pod's CPU and memory count from the reservation on too, so that
	// the informer's bound pod changes nothing and the node is summarized
	// once per bind (addLocked), not again when the bind is seen.
	st.replaceHostLocked(d.UID, hostEntry{node: node, req: d.Pod.Host}, d.Pod.Host != (vgpu.HostResources{}))
	st.addLocked(e)
	return e, nil
}

// checkLocked fits d on node and returns the verdict and the node's usage
// generation it saw. Callers hold st.mu.
func (st *State) checkLocked(node string, d *Demand, now time.Time) (Verdict, uint64, error) {
	if e := st.pods[d.UID]; e != nil && e.reserved {
		return Verdict{}, 0, &BusyError{Entry: e}
	}
	v := st.evaluateLocked(node, d, now)
	if !v.Fits {
		return v, 0, fmt.Errorf("node %s: %w", node, &vgpu.FitError{Reason: v.Reason, Message: v.Message})
	}
	return v, st.nodes[node].gen, nil
}

// Reserving reports whether e is still counted as a reservation: the
// informer has not seen its pod bound, finished or deleted, and nothing
// released it.
func (st *State) Reserving(e *Entry) bool {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.pods[e.uid] == e && e.reserved
}

// keyedMutex is one mutex per key, created on first use and kept (one per
// node).
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// lock locks key's mutex and returns its unlock function.
func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*sync.Mutex{}
	}
	m := k.locks[key]
	if m == nil {
		m = &sync.Mutex{}
		k.locks[key] = m
	}
	k.mu.Unlock()
	m.Lock()
	return m.Unlock
}

package retry

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pacing of the retries asked for: Delay after a change (pods
// kube-scheduler retries on its own within that time are rejected again
// after the change, or bound, and need nothing); at most Batch pods per
// pass, the others Delay later, so that the extender's API budget stays
// with Bind; and at most once per Interval for one pod, so that a pod
// kube-scheduler keeps in back-off while changes come every second is not
// written to at that pace. The retry loop waits Delay; Due applies the
// other two.
const (
	Delay    = 2 * time.Second
	Batch    = 20
	Interval = 30 * time.Second
)

// changeKind is what changed on a node, for deciding which pods it may
// let fit there.
type changeKind uint8

const (
	// changeReady: the node's plugin became ready (label, allocatable,
	// heartbeat back, registered again), or the node became known.
	changeReady changeKind = iota
	// changeInventory: the node's GPU inventory changed.
	changeInventory
	// changeFreed: a pod counted on the node went, freeing what it held.
	changeFreed
	changeKinds
)

// cures says, per change kind, which rejection classes it may cure.
var cures = [changeKinds][]Class{
	changeReady:     {ClassNotReady},
	changeInventory: {ClassNotReady, ClassInventory, ClassCapacity},
	changeFreed:     {ClassCapacity},
}

// Tracker remembers the pods Filter turned away from every node, with the
// nodes and reasons, and the changes since that may cure those reasons,
// and tells the retry loop when there is work (Wake). A change wakes a pod
// only when it happened on a node that turned the pod away for a reason of
// a class the change may cure, after that Filter read the state, and the
// pod fits that node now (Due's fits). Changes are numbered rather than
// timed, so that a Filter and a change within the same clock tick are
// still ordered. D is the pod's demand, kept only to be handed back to
// fits.
//
// The cluster state calls NodeReady, InventoryChanged, Freed, Synced and
// Forget; Filter calls Seen, then Rejected or Forget; the retry loop
// calls Wake, Due and Failed. Safe for concurrent use; create it with New.
type Tracker[D any] struct {
	// changes counts the changes so far; Filter reads it before it reads
	// the state.
	changes atomic.Uint64

	mu sync.Mutex
	// waiting are the pods turned away by Filter, by UID.
	waiting map[types.UID]*waitingPod[D]
	// last is, per change kind and node index, the number of the latest
	// change; everywhere is the number of the latest change that may cure
	// every pod everywhere (the caches synced).
	last       [changeKinds][]uint64
	everywhere uint64
	// dirty lists the nodes changed since every waiting pod last looked;
	// inDirty is its set.
	dirty   []int
	inDirty nodeSet
	// forgotten is the number of the latest change whose node is not in
	// last: counted while no pod waited, or dropped once every waiting pod
	// had looked at it. A Filter that read the state before it cannot be
	// judged against the recorded changes.
	forgotten uint64
	// lastChange is when the latest change happened.
	lastChange time.Time
	// wake has room for one signal: pods may wait since before a change.
	wake chan struct{}
	// now times when a pod was first turned away (waitingPod.since); nil
	// leaves it zero.
	now func() time.Time
}

type waitingPod[D any] struct {
	Pod
	// since is when Filter first turned the pod away (Tracker.now).
	since time.Time
	// d is the pod's demand, to judge whether it fits a changed node.
	d D
	// rej is what the latest Filter turned it away for.
	rej Rejection
	// seen is the number of changes before the last Filter that turned the
	// pod away read the state, or when it was last asked to retry, or
	// when Due last found that no change since helps it.
	seen uint64
	// raced is set when the Filter that turned the pod away read the
	// state before a change that was counted before it was recorded (the
	// change's node may be forgotten already), or when asking it failed:
	// the pod is due at the next change whatever it was.
	raced bool
}

// Pod is a waiting pod Due says to ask to retry.
type Pod struct {
	UID             types.UID
	Namespace, Name string
	// askedAt is when the pod was last asked to retry; zero if never.
	askedAt time.Time
}

// New returns a Tracker with nothing waiting, timing the first rejection
// of each pod by now (nil: untimed, so Pending reports no wait).
func New[D any](now func() time.Time) *Tracker[D] {
	return &Tracker[D]{waiting: map[types.UID]*waitingPod[D]{}, wake: make(chan struct{}, 1), now: now}
}

// Wake receives a signal when pods may wait since before a change: the
// retry loop calls Due some time after. One signal stands for any number
// of changes.
func (t *Tracker[D]) Wake() <-chan struct{} { return t.wake }

// Seen returns the number of changes so far; Filter calls it before it
// reads the state and passes it to Rejected.
func (t *Tracker[D]) Seen() uint64 { return t.changes.Load() }

// Rejected records that a Filter which had seen seen changes turned pod,
// whose demand is d, away from every node, for rej. A change since, which
// that Filter may have missed, wakes the loop.
func (t *Tracker[D]) Rejected(pod *corev1.Pod, d D, seen uint64, rej Rejection) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.waiting[pod.UID]
	if w == nil {
		w = &waitingPod[D]{Pod: Pod{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name}}
		if t.now != nil {
			w.since = t.now()
		}
		t.waiting[pod.UID] = w
	}
	w.d, w.rej = d, rej
	w.seen = max(w.seen, seen)
	switch {
	case rej.Elsewhere || t.forgotten > seen:
		// A change this Filter may have missed is no longer recorded
		// by node: the pod is due at the next pass, whatever it was.
		w.raced = true
		t.signal()
	case t.changes.Load() > seen:
		// The changes since are recorded: the next pass asks the pod
		// to retry only if one may cure what turned it away (helps).
		t.signal()
	}
}

// Forget stops tracking a pod: it was bound, finished, deleted, or passed
// some node. Forgetting a pod not tracked does nothing.
func (t *Tracker[D]) Forget(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.waiting, uid)
}

// NodeReady records that the node with index node became ready for pods
// at at: its plugin (label, allocatable, heartbeat back, registered
// again), or the node became known.
func (t *Tracker[D]) NodeReady(at time.Time, node int) { t.changed(at, node, changeReady) }

// InventoryChanged records that the GPU inventory of the node with index
// node changed at at.
func (t *Tracker[D]) InventoryChanged(at time.Time, node int) {
	t.changed(at, node, changeInventory)
}

// Freed records that a pod counted on the node with index node went at at,
// freeing what it held.
func (t *Tracker[D]) Freed(at time.Time, node int) { t.changed(at, node, changeFreed) }

// changed records a change of kind on the node with index node at at.
func (t *Tracker[D]) changed(at time.Time, node int, kind changeKind) {
	t.mu.Lock()
	defer t.mu.Unlock()
	seq := t.changes.Add(1)
	t.lastChange = at
	if len(t.waiting) == 0 {
		t.forgotten = seq
		return
	}
	for len(t.last[kind]) <= node {
		t.last[kind] = append(t.last[kind], 0)
	}
	t.last[kind][node] = seq
	if !t.inDirty.has(node) {
		t.inDirty.add(node)
		t.dirty = append(t.dirty, node)
	}
	t.signal()
}

// Synced records a change at at that may let every waiting pod fit
// anywhere: the informers' first lists are counted.
func (t *Tracker[D]) Synced(at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.everywhere = t.changes.Add(1)
	t.lastChange = at
	if len(t.waiting) > 0 {
		t.signal()
	}
}

// Failed puts back a pod Due returned whose retry request failed: it is
// due again in the next pass. A pod forgotten or turned away again since
// stays as it is.
func (t *Tracker[D]) Failed(p Pod) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.waiting[p.UID]
	if w == nil || !w.askedAt.Equal(p.askedAt) {
		return // forgotten, or turned away again since
	}
	w.seen, w.askedAt, w.raced = 0, time.Time{}, true
	t.signal()
}

// signal wakes the loop. Callers hold mu.
func (t *Tracker[D]) signal() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Due returns when the latest change happened and the pods to ask now:
// those a change since their last Filter may let fit (see Tracker), as
// fits(demand, node index) confirms, not asked within Interval before now,
// at most Batch of them, the most recently turned away first (the
// likeliest to have raced the change). It marks them asked, and pods that
// no change helps as having seen every change. again is when another pass
// is needed for the pods it left out; 0 when none is.
// fits is called with the Tracker's lock held: a fits that reads the
// cluster state runs under the state's read lock, which Due's caller takes.
func (t *Tracker[D]) Due(now time.Time, fits func(d *D, node int) bool) (at time.Time, pods []Pod, again time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	changes := t.changes.Load()
	var ready []*waitingPod[D]
	for _, w := range t.waiting {
		if w.seen >= changes && !w.raced {
			continue
		}
		if !w.askedAt.IsZero() {
			if wait := Interval - now.Sub(w.askedAt); wait > 0 {
				if again == 0 || wait < again {
					again = wait
				}
				continue
			}
		}
		if !t.helps(w, fits) {
			w.seen = changes
			continue
		}
		ready = append(ready, w)
	}
	slices.SortFunc(ready, func(a, b *waitingPod[D]) int { return cmp.Compare(b.seen, a.seen) })
	if len(ready) > Batch {
		ready = ready[:Batch]
		again = time.Nanosecond // the next pass, Delay from now
	}
	for _, w := range ready {
		w.seen, w.askedAt, w.raced = changes, now, false
		pods = append(pods, w.Pod)
	}
	if again == 0 {
		// Every waiting pod has looked at every change: forget them.
		for _, n := range t.dirty {
			for k := range t.last {
				if n < len(t.last[k]) {
					t.last[k][n] = 0
				}
			}
		}
		t.dirty, t.inDirty = t.dirty[:0], t.inDirty[:0]
		t.forgotten = changes
	}
	return t.lastChange, pods, again
}

// helps reports whether a change since w last looked may let w fit: w
// raced a change, a change everywhere, or a change on a node that turned
// w away for a reason the change may cure (or on any node, when some node
// turned it away unjudged) and where w fits now. Callers hold mu.
func (t *Tracker[D]) helps(w *waitingPod[D], fits func(d *D, node int) bool) bool {
	if w.raced || t.everywhere > w.seen {
		return true
	}
	for _, n := range t.dirty {
		changed := w.rej.Unjudged
		for k := range changeKinds {
			if n >= len(t.last[k]) || t.last[k][n] <= w.seen {
				continue
			}
			for _, c := range cures[k] {
				if w.rej.nodes[c].has(n) {
					changed = true
				}
			}
		}
		if changed && fits(&w.d, n) {
			return true
		}
	}
	return false
}

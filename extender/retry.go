package extender

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/vgpu"
)

// AnnotationRetry is the pod annotation the extender sets to make
// kube-scheduler try again a pod that Filter turned away before the
// extender's informers had seen a change that may let it fit. Its value is
// the time of that change (RFC 3339).
//
// kube-scheduler retries an unschedulable pod when a Node or pod event it
// watches may help. Its informers and the extender's are separate watches,
// so the scheduler can retry on a Node update (plugin registered, room
// freed by a deleted pod) before the extender has seen it: the extender
// then turns the pod away on its older view, and nothing wakes the pod
// again for up to five minutes. A heartbeat Lease coming back is never an
// event for kube-scheduler at all. An update of the pod itself is: that is
// what the annotation is for.
const AnnotationRetry = "gpuslice.io/scheduler-retry"

// Pacing of the retries asked for: retryDelay after a change (pods
// kube-scheduler retries on its own within that time are rejected again
// after the change, or bound, and need nothing); at most retryBatch pods
// per pass, the others retryDelay later, so that the extender's API budget
// stays with Bind; and at most once per retryInterval for one pod, so that
// a pod kube-scheduler keeps in back-off while changes come every second
// is not written to at that pace.
const (
	retryDelay    = 2 * time.Second
	retryBatch    = 20
	retryInterval = 30 * time.Second
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

// rejectClass groups Filter's reasons by what can cure them.
type rejectClass uint8

const (
	// classNotReady: the plugin does not serve the node, or the node is
	// unknown (extender reasons).
	classNotReady rejectClass = iota
	// classInventory: too few healthy GPUs of the wanted model or UUID.
	classInventory
	// classCapacity: slices, memory, cores or NUMA: room that pods hold.
	classCapacity
	rejectClasses
)

// cures says, per change kind, which rejection classes it may cure.
var cures = [changeKinds][]rejectClass{
	changeReady:     {classNotReady},
	changeInventory: {classNotReady, classInventory, classCapacity},
	changeFreed:     {classCapacity},
}

// classOf is the rejection class of a verdict's reason.
func classOf(r vgpu.Reason) rejectClass {
	switch r {
	case vgpu.ReasonUnhealthy, vgpu.ReasonModel, vgpu.ReasonUUID, vgpu.ReasonEnforcement:
		return classInventory
	case vgpu.ReasonNoFreeSlice, vgpu.ReasonInsufficientMemory, vgpu.ReasonInsufficientCores, vgpu.ReasonNUMA:
		return classCapacity
	}
	return classNotReady
}

// nodeSet is a set of node indexes (nodeState.index).
type nodeSet []uint64

func (b *nodeSet) add(i int) {
	for len(*b) <= i/64 {
		*b = append(*b, 0)
	}
	(*b)[i/64] |= 1 << (i % 64)
}

func (b nodeSet) has(i int) bool { return i/64 < len(b) && b[i/64]&(1<<(i%64)) != 0 }

// rejection is what one Filter turned a pod away for: the nodes of each
// class, and whether some node was turned away before it could be judged
// (unknown to the cache, or the caches not synced yet).
type rejection struct {
	nodes   [rejectClasses]nodeSet
	unjudge bool
	// elsewhere is set when a node the Filter was not asked about fits
	// the pod now (kube-scheduler sent a sample): it is due at the next
	// pass, whatever changed.
	elsewhere bool
}

// judged reports whether the node with index node turned the pod away.
func (r *rejection) judged(node int) bool {
	for _, set := range r.nodes {
		if set.has(node) {
			return true
		}
	}
	return false
}

// retries remembers the pods Filter turned away from every node, with the
// nodes and reasons, and the changes since that may cure those reasons,
// and tells retryLoop when there is work. A change wakes a pod only when
// it happened on a node that turned the pod away for a reason of a class
// the change may cure, after that Filter read the state, and the pod fits
// that node now (due's fits). Changes are numbered rather than timed, so
// that a Filter and a change within the same clock tick are still ordered.
// Safe for concurrent use. Lock order: clusterState.mu before retries.mu.
type retries struct {
	// changes counts the changes so far; Filter reads it before it reads
	// the state.
	changes atomic.Uint64

	mu sync.Mutex
	// waiting are the pods turned away by Filter, by UID.
	waiting map[types.UID]*waitingPod
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

type waitingPod struct {
	uid             types.UID
	namespace, name string
	// since is when Filter first turned the pod away (retries.now).
	since time.Time
	// d is the pod's demand, to judge whether it fits a changed node.
	d demand
	// rej is what the latest Filter turned it away for.
	rej rejection
	// seen is the number of changes before the last Filter that turned the
	// pod away read the state, or when it was last asked to retry, or
	// when due last found that no change since helps it.
	seen uint64
	// askedAt is when the pod was last asked to retry; zero if never.
	askedAt time.Time
	// raced is set when the Filter that turned the pod away read the
	// state before a change that was counted before it was recorded (the
	// change's node may be forgotten already), or when asking it failed:
	// the pod is due at the next change whatever it was.
	raced bool
}

func newRetries() *retries {
	return &retries{waiting: map[types.UID]*waitingPod{}, wake: make(chan struct{}, 1)}
}

// seen returns the number of changes so far; Filter calls it before it
// reads the state and passes it to rejected.
func (r *retries) seen() uint64 { return r.changes.Load() }

// rejected records that a Filter which had seen seen changes turned pod,
// whose demand is d, away from every node, for rej. A change since, which
// that Filter may have missed, wakes the loop.
func (r *retries) rejected(pod *corev1.Pod, d demand, seen uint64, rej rejection) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.waiting[pod.UID]
	if w == nil {
		w = &waitingPod{uid: pod.UID, namespace: pod.Namespace, name: pod.Name}
		if r.now != nil {
			w.since = r.now()
		}
		r.waiting[pod.UID] = w
	}
	w.d, w.rej = d, rej
	w.seen = max(w.seen, seen)
	switch {
	case rej.elsewhere || r.forgotten > seen:
		// A change this Filter may have missed is no longer recorded
		// by node: the pod is due at the next pass, whatever it was.
		w.raced = true
		r.signal()
	case r.changes.Load() > seen:
		// The changes since are recorded: the next pass asks the pod
		// to retry only if one may cure what turned it away (helps).
		r.signal()
	}
}

// forget stops tracking a pod: it was bound, finished, deleted, or passed
// some node.
func (r *retries) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waiting, uid)
}

// changed records a change of kind on the node with index node at at.
func (r *retries) changed(at time.Time, node int, kind changeKind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seq := r.changes.Add(1)
	r.lastChange = at
	if len(r.waiting) == 0 {
		r.forgotten = seq
		return
	}
	for len(r.last[kind]) <= node {
		r.last[kind] = append(r.last[kind], 0)
	}
	r.last[kind][node] = seq
	if !r.inDirty.has(node) {
		r.inDirty.add(node)
		r.dirty = append(r.dirty, node)
	}
	r.signal()
}

// changedEverywhere records a change at at that may let every waiting pod
// fit anywhere: the informers synced.
func (r *retries) changedEverywhere(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.everywhere = r.changes.Add(1)
	r.lastChange = at
	if len(r.waiting) > 0 {
		r.signal()
	}
}

// failed puts back a pod due returned whose retry request failed: it is
// due again in the next pass.
func (r *retries) failed(p waitingPod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.waiting[p.uid]
	if w == nil || !w.askedAt.Equal(p.askedAt) {
		return // forgotten, or turned away again since
	}
	w.seen, w.askedAt, w.raced = 0, time.Time{}, true
	r.signal()
}

// signal wakes the loop. Callers hold mu.
func (r *retries) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// due returns when the latest change happened and the pods to ask now:
// those a change since their last Filter may let fit (see retries), as
// fits(pod, node index) confirms, not asked within retryInterval before
// now, at most retryBatch of them, the most recently turned away first
// (the likeliest to have raced the change). It marks them asked, and pods
// that no change helps as having seen every change. again is when another
// pass is needed for the pods it left out; 0 when none is. Callers that
// pass a fits reading the cluster state hold its read lock.
func (r *retries) due(now time.Time, fits func(w *waitingPod, node int) bool) (at time.Time, pods []waitingPod, again time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	changes := r.changes.Load()
	var ready []*waitingPod
	for _, w := range r.waiting {
		if w.seen >= changes && !w.raced {
			continue
		}
		if !w.askedAt.IsZero() {
			if wait := retryInterval - now.Sub(w.askedAt); wait > 0 {
				if again == 0 || wait < again {
					again = wait
				}
				continue
			}
		}
		if !r.helps(w, fits) {
			w.seen = changes
			continue
		}
		ready = append(ready, w)
	}
	slices.SortFunc(ready, func(a, b *waitingPod) int { return cmp.Compare(b.seen, a.seen) })
	if len(ready) > retryBatch {
		ready = ready[:retryBatch]
		again = time.Nanosecond // the next pass, retryDelay from now
	}
	for _, w := range ready {
		w.seen, w.askedAt, w.raced = changes, now, false
		pods = append(pods, *w)
	}
	if again == 0 {
		// Every waiting pod has looked at every change: forget them.
		for _, n := range r.dirty {
			for k := range r.last {
				if n < len(r.last[k]) {
					r.last[k][n] = 0
				}
			}
		}
		r.dirty, r.inDirty = r.dirty[:0], r.inDirty[:0]
		r.forgotten = changes
	}
	return r.lastChange, pods, again
}

// helps reports whether a change since w last looked may let w fit: w
// raced a change, a change everywhere, or a change on a node that turned
// w away for a reason the change may cure (or on any node, when some node
// turned it away unjudged) and where w fits now. Callers hold mu.
func (r *retries) helps(w *waitingPod, fits func(w *waitingPod, node int) bool) bool {
	if w.raced || r.everywhere > w.seen {
		return true
	}
	for _, n := range r.dirty {
		changed := w.rej.unjudge
		for k := range changeKinds {
			if n >= len(r.last[k]) || r.last[k][n] <= w.seen {
				continue
			}
			for _, c := range cures[k] {
				if w.rej.nodes[c].has(n) {
					changed = true
				}
			}
		}
		if changed && fits(w, n) {
			return true
		}
	}
	return false
}

// retryLoop sets AnnotationRetry on the pods that wait since before a
// change, retryDelay after it, until ctx ends.
func (s *Scheduler) retryLoop(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("retry")
	later := time.NewTimer(time.Hour)
	later.Stop()
	defer later.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.state.retries.wake:
		case <-later.C:
		}
		pause := time.NewTimer(retryDelay)
		select {
		case <-ctx.Done():
			pause.Stop()
			return
		case <-pause.C:
		}
		at, pods, again := s.dueRetries()
		if again > 0 {
			later.Reset(again)
		}
		for _, p := range pods {
			err := s.askRetry(ctx, p, at)
			switch {
			case err == nil:
				s.metrics.retries.Inc()
				logger.V(2).Info("Asked kube-scheduler to retry a pod", "pod", klog.KRef(p.namespace, p.name), "changedAt", at)
			case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsInvalid(err):
				// Gone, or replaced by a pod of the same name (a Filter
				// that ran while the informer saw it go can have
				// recorded it again).
				s.state.retries.forget(p.uid)
			case ctx.Err() != nil:
				return
			default:
				s.state.retries.failed(p)
				logger.Info("Could not ask kube-scheduler to retry a pod; trying again in the next pass", "pod", klog.KRef(p.namespace, p.name), "err", err.Error())
			}
		}
	}
}

// dueRetries is retries.due with fits judging, under the state's read
// lock, whether the waiting pod fits the node now.
func (s *Scheduler) dueRetries() (time.Time, []waitingPod, time.Duration) {
	now := s.clock.Now()
	st := s.state
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.retries.due(now, func(w *waitingPod, node int) bool {
		return node < len(st.byIndex) && s.evaluateLocked(st.byIndex[node].name, &w.d, now).fits
	})
}

// askRetry sets AnnotationRetry on the waiting pod, with its UID as
// precondition (a merge patch cannot change the UID, so a pod recreated
// under the same name refuses it). A pod bound since gets the annotation
// too, harmlessly.
func (s *Scheduler) askRetry(ctx context.Context, p waitingPod, at time.Time) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         p.uid,
		"annotations": map[string]string{AnnotationRetry: at.UTC().Format(time.RFC3339Nano)},
	}})
	if err != nil {
		return fmt.Errorf("encode patch: %w", err)
	}
	_, err = s.client.CoreV1().Pods(p.namespace).Patch(ctx, p.name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: fieldManager})
	return err
}

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

// retries remembers the pods Filter turned away from some node and counts
// the changes that may let such pods fit, and tells retryLoop when there is
// work. Changes are numbered rather than timed so that a Filter and a
// change within the same clock tick are still ordered. Safe for concurrent
// use. Lock order: clusterState.mu before retries.mu.
type retries struct {
	// changes counts the changes so far; Filter reads it before it reads
	// the state.
	changes atomic.Uint64

	mu sync.Mutex
	// waiting are the pods turned away by Filter, by UID.
	waiting map[types.UID]*waitingPod
	// lastChange is when the latest change happened.
	lastChange time.Time
	// wake has room for one signal: pods may wait since before a change.
	wake chan struct{}
}

type waitingPod struct {
	uid             types.UID
	namespace, name string
	// seen is the number of changes before the last Filter that turned the
	// pod away read the state, or when the pod was last asked to retry.
	seen uint64
	// askedAt is when the pod was last asked to retry; zero if never.
	askedAt time.Time
}

func newRetries() *retries {
	return &retries{waiting: map[types.UID]*waitingPod{}, wake: make(chan struct{}, 1)}
}

// seen returns the number of changes so far; Filter calls it before it
// reads the state and passes it to rejected.
func (r *retries) seen() uint64 { return r.changes.Load() }

// rejected records that a Filter which had seen seen changes turned pod
// away from at least one node. A change since, which that Filter may have
// missed, wakes the loop.
func (r *retries) rejected(pod *corev1.Pod, seen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.waiting[pod.UID]
	if w == nil {
		w = &waitingPod{uid: pod.UID, namespace: pod.Namespace, name: pod.Name}
		r.waiting[pod.UID] = w
	}
	w.seen = max(w.seen, seen)
	if r.changes.Load() > seen {
		r.signal()
	}
}

// forget stops tracking a pod: it was bound, finished, deleted, or passed
// every node.
func (r *retries) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waiting, uid)
}

// changed records a change at at that may let a waiting pod fit: a node's
// plugin became ready, its inventory changed, or a pod's usage was freed.
func (r *retries) changed(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes.Add(1)
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
	w.seen, w.askedAt = 0, time.Time{}
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
// those whose last Filter read a state older than it, not asked within
// retryInterval before now, at most retryBatch of them, the most recently
// turned away first (the likeliest to have raced the change). It marks
// them asked. again is when another pass is needed for the pods it left
// out; 0 when none is.
func (r *retries) due(now time.Time) (at time.Time, pods []waitingPod, again time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	changes := r.changes.Load()
	var ready []*waitingPod
	for _, w := range r.waiting {
		if w.seen >= changes {
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
		ready = append(ready, w)
	}
	slices.SortFunc(ready, func(a, b *waitingPod) int { return cmp.Compare(b.seen, a.seen) })
	if len(ready) > retryBatch {
		ready = ready[:retryBatch]
		again = time.Nanosecond // the next pass, retryDelay from now
	}
	for _, w := range ready {
		w.seen, w.askedAt = changes, now
		pods = append(pods, *w)
	}
	return r.lastChange, pods, again
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
		at, pods, again := s.state.retries.due(s.clock.Now())
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

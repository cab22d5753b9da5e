package extender

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

// A pod Bind placed counts from its reservation until the pod informer
// sees it deleted. That informer only reports the deletion of pods it has
// in its cache: when its watch breaks (an API server restart) and a pod
// is created, bound by Bind (which then reads it from the API server) and
// deleted within the gap, the list that ends the gap does not have it and
// no event ever releases what it holds (found by the chaos soak: a slice
// held for good by a pod that no longer existed). confirmBinds closes
// that gap: every bound pod the informer has not shown after
// confirmGrace is read from the API server, and one that is gone, or is
// another pod of that name, or has finished, stops counting.
const (
	// confirmGrace is how long after its Binding a pod may stay unseen
	// by the informer before it is read: a watch normally delivers it
	// within milliseconds.
	confirmGrace = 10 * time.Second
	// confirmInterval is how often the unseen binds are looked at.
	confirmInterval = 5 * time.Second
)

// unconfirmedBinds are the pods whose Binding the API server accepted
// and the informer's cache did not have then, by UID. Safe for concurrent
// use.
type unconfirmedBinds struct {
	mu   sync.Mutex
	pods map[types.UID]unconfirmedBind
}

// unconfirmedBind is one pod of unconfirmedBinds, bound at at.
type unconfirmedBind struct {
	namespace, name string
	at              time.Time
}

// add records pod, bound at at.
func (u *unconfirmedBinds) add(pod *corev1.Pod, at time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.pods == nil {
		u.pods = map[types.UID]unconfirmedBind{}
	}
	u.pods[pod.UID] = unconfirmedBind{namespace: pod.Namespace, name: pod.Name, at: at}
}

// due returns the pods bound before cutoff, by UID.
func (u *unconfirmedBinds) due(cutoff time.Time) map[types.UID]unconfirmedBind {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[types.UID]unconfirmedBind{}
	for uid, b := range u.pods {
		if b.at.Before(cutoff) {
			out[uid] = b
		}
	}
	return out
}

// done stops tracking uid.
func (u *unconfirmedBinds) done(uid types.UID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.pods, uid)
}

// bound records that Bind bound pod: one the informer's cache did not
// have (seen false) is tracked until the cache has it (confirmBinds).
func (s *Scheduler) bound(pod *corev1.Pod, seen bool) {
	if !seen {
		s.unconfirmed.add(pod, s.clock.Now())
	}
}

// cachedPod returns what the pod informer's cache holds for the pod
// namespace/name with uid (a *gpuPod, or a *podMeta for a pod that asks
// for no GPU), and false when it holds nothing of that name and UID.
func (s *Scheduler) cachedPod(namespace, name string, uid types.UID) (any, bool) {
	store := s.pods.Load()
	if store == nil {
		return nil, false
	}
	obj, ok, err := (*store).GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	var got types.UID
	switch o := obj.(type) {
	case *gpuPod:
		got = o.UID
	case *podMeta:
		got = o.UID
	}
	if got != uid {
		return nil, false
	}
	return obj, true
}

// confirmLoop runs confirmBinds and resolveDoubts every confirmInterval
// until ctx ends.
func (s *Scheduler) confirmLoop(ctx context.Context) {
	t := time.NewTicker(confirmInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.confirmBinds(ctx)
		s.resolveDoubts(ctx)
	}
}

// confirmBinds looks at every pod bound more than confirmGrace ago that
// the informer's cache did not have: one the cache has now is left to the
// informer, whose events (a deletion's tombstone included) release it;
// any other is read from the API server, and what it holds is released
// when the API server has no such pod, has another pod of that name, or
// the pod finished. A pod the API server still has bound is looked at
// again next time; so is one whose read fails.
func (s *Scheduler) confirmBinds(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for uid, b := range s.unconfirmed.due(s.clock.Now().Add(-confirmGrace)) {
		if _, seen := s.cachedPod(b.namespace, b.name, uid); seen {
			s.unconfirmed.done(uid)
			continue
		}
		readCtx, cancel := context.WithTimeout(ctx, s.cfg.BindTimeout.Duration)
		pod, err := s.client.CoreV1().Pods(b.namespace).Get(readCtx, b.name, metav1.GetOptions{})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			logger.V(2).Info("Could not read a bound pod the informer has not seen; trying again later", "pod", klog.KRef(b.namespace, b.name), "podUID", uid, "err", err.Error())
			continue
		case pod.UID == uid && !cluster.Terminal(pod.Status.Phase):
			continue // still there: the informer will see it
		}
		s.state.DeletePod(uid)
		s.unconfirmed.done(uid)
		s.metrics.staleReleased.Inc()
		logger.Info("Released what a pod the informer never saw holds: the API server no longer has it running", "pod", klog.KRef(b.namespace, b.name), "podUID", uid)
	}
}

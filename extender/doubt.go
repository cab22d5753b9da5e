package extender

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/extender/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// A Binding whose outcome is unknown (no answer, a lost reply, a 5xx) may
// still be committed after Bind gave up on it: the API server goes on with
// a request its client abandoned until its own request deadline, and etcd
// commits a write it was handed even when its caller stopped waiting. A
// read that finds the pod unbound then says only that the Binding has not
// been committed yet. So its reservation stays, in doubt, until one of:
//
//   - the informer sees the pod bound (it then counts as bound, on whatever
//     node it is), finished or deleted;
//   - a read of the pod from etcd (a GET without resourceVersion, which the
//     API server serves from etcd with a quorum read) finds it bound, gone,
//     replaced, finished or being deleted: a Binding can never be committed
//     on such a pod;
//   - a read made once Config.BindOutcomeWait has passed since the Binding
//     was sent finds it still unbound: by then the API server has stopped
//     working on the request and etcd has committed or dropped what it was
//     given, so the Binding is lost.
//
// Until then the pod's GPUs stay taken on that node, and Bind refuses the
// pod (errBindInDoubt names until when), so no slice is given to two pods.

// ErrBindInDoubt is wrapped by the Bind error of a pod whose Binding had an
// unknown outcome and whose read found it not bound yet: its GPUs stay
// reserved on the node (see doubtfulBinds) and kube-scheduler retries the
// pod, which is bound by then or refused until the doubt is settled.
var ErrBindInDoubt = errors.New("binding outcome unknown")

// doubtfulBinds are the reservations whose Binding had an unknown outcome,
// by pod UID. Safe for concurrent use; its lock is taken last (under the
// state's lock, too) and takes none.
type doubtfulBinds struct {
	mu    sync.Mutex
	binds map[types.UID]doubtfulBind
}

// doubtfulBind is one bind in doubt.
type doubtfulBind struct {
	entry           *cluster.Entry
	namespace, name string
	// until is when a read that finds the pod unbound releases the entry:
	// when the Binding was sent plus Config.BindOutcomeWait.
	until time.Time
}

// add records e, the reservation of pod, in doubt until until.
func (d *doubtfulBinds) add(pod *corev1.Pod, e *cluster.Entry, until time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.binds == nil {
		d.binds = map[types.UID]doubtfulBind{}
	}
	d.binds[e.UID()] = doubtfulBind{entry: e, namespace: pod.Namespace, name: pod.Name, until: until}
}

// get returns the bind in doubt of uid, if any.
func (d *doubtfulBinds) get(uid types.UID) (doubtfulBind, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.binds[uid]
	return b, ok
}

// all returns every bind in doubt.
func (d *doubtfulBinds) all() []doubtfulBind {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]doubtfulBind, 0, len(d.binds))
	for _, b := range d.binds {
		out = append(out, b)
	}
	return out
}

// done stops tracking e, unless a later bind of its pod replaced it.
func (d *doubtfulBinds) done(e *cluster.Entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b, ok := d.binds[e.UID()]; ok && b.entry == e {
		delete(d.binds, e.UID())
	}
}

// bindOutcome is what a read of the pod says of a Binding whose outcome was
// unknown.
type bindOutcome int

const (
	// bindPending: the pod is unbound; the Binding may still be committed.
	bindPending bindOutcome = iota
	// bindLanded: the pod is bound to the reservation's node with its
	// allocation.
	bindLanded
	// bindImpossible: the Binding can never be committed now: the pod is
	// gone, replaced, being deleted, finished, or bound otherwise.
	bindImpossible
)

// readOutcome reads pod namespace/name from etcd (a GET without
// resourceVersion) and tells what it says of e's Binding. The error is the
// read's, with bindPending.
func (s *Scheduler) readOutcome(ctx context.Context, e *cluster.Entry, namespace, name string) (bindOutcome, error) {
	cur, err := s.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return bindImpossible, nil
	case err != nil:
		return bindPending, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	case cur.UID != e.UID() || cur.DeletionTimestamp != nil || cluster.Terminal(cur.Status.Phase):
		return bindImpossible, nil
	case cur.Spec.NodeName == "":
		return bindPending, nil
	case cur.Spec.NodeName == e.Node() && cur.Annotations[vgpu.AnnotationPodAllocation] == e.Raw():
		return bindLanded, nil
	}
	return bindImpossible, nil
}

// doubt keeps e, the reservation of pod whose Binding sent at sent failed
// with err of unknown outcome, in doubt, and returns Bind's error.
func (s *Scheduler) doubt(ctx context.Context, pod *corev1.Pod, e *cluster.Entry, sent time.Time, err error) error {
	until := sent.Add(s.cfg.BindOutcomeWait.Duration)
	s.doubts.add(pod, e, until)
	klog.FromContext(ctx).Info("Binding outcome unknown and the pod not bound yet: keeping its GPUs reserved", "until", until, "err", err.Error())
	return fmt.Errorf("%w (%w): %s", err, ErrBindInDoubt, doubtMessage(e.Node(), until))
}

// doubtMessage says what a pod whose Binding to node is in doubt until
// until holds.
func doubtMessage(node string, until time.Time) string {
	return fmt.Sprintf("the pod keeps its GPUs on node %s until the API server shows it bound or gone, or still unbound after %s (bindOutcomeWait)", node, until.UTC().Format(time.RFC3339))
}

// resolveDoubts settles the binds in doubt whose wait has passed: one the
// informer settled already is forgotten; any other pod is read from etcd,
// and its reservation released unless it is bound as reserved (then it
// counts as bound, and confirmBinds tracks it until the informer sees it).
// A pod whose read fails is read again next time. Called by confirmLoop.
func (s *Scheduler) resolveDoubts(ctx context.Context) {
	logger := klog.FromContext(ctx)
	now := s.clock.Now()
	for _, b := range s.doubts.all() {
		if now.Before(b.until) {
			continue
		}
		e := b.entry
		if !s.state.Reserving(e) {
			s.doubts.done(e)
			continue
		}
		readCtx, cancel := context.WithTimeout(ctx, s.cfg.BindTimeout.Duration)
		outcome, err := s.readOutcome(readCtx, e, b.namespace, b.name)
		cancel()
		log := logger.WithValues("pod", klog.KRef(b.namespace, b.name), "podUID", e.UID(), "node", e.Node())
		switch {
		case err != nil:
			log.V(2).Info("Could not read a pod whose Binding is in doubt; trying again later", "err", err.Error())
			continue
		case outcome == bindLanded:
			s.unconfirmed.add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: b.namespace, Name: b.name, UID: e.UID()}}, now)
			log.Info("The Binding in doubt was committed; the pod keeps its GPUs")
		case s.state.Release(e):
			log.Info("Released the GPUs of a pod whose Binding in doubt was not committed", "bindOutcomeWait", s.cfg.BindOutcomeWait.Duration)
		}
		s.doubts.done(e)
	}
}

// bindsInDoubt counts the reservations still in doubt.
func (s *Scheduler) bindsInDoubt() int {
	n := 0
	for _, b := range s.doubts.all() {
		if s.state.Reserving(b.entry) {
			n++
		}
	}
	return n
}

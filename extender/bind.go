package extender

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/extender/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// fieldManager names the extender's writes on the API server.
const fieldManager = "gpuslice-scheduler"

// ErrOverloaded is wrapped by the Bind error of a call refused at once
// because Config.MaxPendingBinds binds are already waiting for the API
// client: kube-scheduler puts the pod back in its queue (with back-off)
// instead of waiting out its bind timeout and retrying into a collapse.
var ErrOverloaded = errors.New("extender overloaded")

// errNotSyncedBind is Bind's answer before the informers synced: without
// every bound pod counted, a slice could be given twice.
var errNotSyncedBind = errors.New(fieldManager + " not ready: informer caches not synced, so bound pods may not all be counted yet; kube-scheduler retries the pod")

// Bind places the pod on args.Node for kube-scheduler's bindVerb, in one
// API request: it takes the pod from the informers' cache (a GET only when
// the cache has not seen it yet), fits it on the node against the
// informers' state plus the reservations of binds in progress, reserves
// the GPUs in memory and posts a Binding that carries the allocation
// annotation in its metadata, with the pod's UID as precondition. The API
// server copies the annotation onto the pod in the same update that sets
// spec.nodeName (FIELD.md §8), so a pod is never left with an allocation
// but no node, and nothing needs undoing. Binds to one node hold that
// node's lock only for the in-memory fit and reservation, so they never
// over-commit a GPU; binds to different nodes do not wait on each other.
// The reservation counts until the informers see the pod bound (then it
// counts as a bound pod) or deleted; a pod the informers never see is
// read from the API server after a while (confirmBinds).
//
// Before the informers synced it refuses (errNotSyncedBind). When
// Config.MaxPendingBinds calls are already waiting for the API client it
// refuses at once (ErrOverloaded). On a failure the API server answered it
// drops the reservation and returns a result with Error; when the
// request's outcome is unknown (a timeout, a lost reply, a 5xx) it reads
// the pod to tell (outcomeAfterAll): a pod bound to args.Node with its
// allocation after all counts as bound, one that can no longer be bound
// drops the reservation, and one not bound yet keeps it, in doubt
// (doubt.go), and the Error wraps ErrBindInDoubt. The Binding request is
// bounded by Config.BindTimeout, and so are the reads that follow one with
// an unknown outcome. A pod that asks for no GPU is
// bound without an annotation. Each call with valid arguments is counted
// in MetricBinds by result. The error is non-nil, wrapping ErrBadArgs, only
// for arguments kube-scheduler never sends.
func (s *Scheduler) Bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (*extenderv1.ExtenderBindingResult, error) {
	switch {
	case args == nil:
		return nil, fmt.Errorf("%w: no binding arguments", ErrBadArgs)
	case args.PodName == "" || args.PodNamespace == "" || args.PodUID == "" || args.Node == "":
		return nil, fmt.Errorf("%w: PodName, PodNamespace, PodUID and Node are required", ErrBadArgs)
	}
	start := s.clock.Now()
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(args.PodNamespace, args.PodName), "podUID", args.PodUID, "node", args.Node)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.BindTimeout.Duration)
	defer cancel()
	var value string
	err := errNotSyncedBind
	if s.Ready() {
		if release, gateErr := s.binds.enter(); gateErr != nil {
			err = gateErr
		} else {
			value, err = s.bind(klog.NewContext(ctx, logger), args)
			release()
		}
	}
	elapsed := s.clock.Since(start)
	s.metrics.bindResult(err)
	if err != nil {
		reason := vgpu.Reason("APIError")
		var fe *vgpu.FitError
		switch {
		case errors.As(err, &fe):
			reason = fe.Reason
		case errors.Is(err, ErrOverloaded):
			reason = "Overloaded"
		case errors.Is(err, errNotSyncedBind):
			reason = "NotSynced"
		case errors.Is(err, ErrBindInDoubt):
			reason = "InDoubt"
		}
		logger.Info("Bind failed", "reason", reason, "err", err.Error(), "duration", elapsed)
		return &extenderv1.ExtenderBindingResult{Error: err.Error()}, nil
	}
	logger.V(2).Info("Bound pod", "allocation", value, "duration", elapsed)
	return &extenderv1.ExtenderBindingResult{}, nil
}

// bind does Bind's work and returns the allocation annotation written ("" for
// a pod without GPUs).
func (s *Scheduler) bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (string, error) {
	pod, seen, err := s.podForBind(ctx, args)
	if err != nil {
		return "", err
	}
	d, err := cluster.DemandOf(pod)
	if err != nil {
		return "", err
	}
	d.ForBind = true
	if !d.WantsGPU() {
		// Its CPU and memory count from now on, so that the next pods of a
		// burst see them taken; if the Binding did land after all, the
		// informer counts them again when it sees the pod bound.
		undo := s.state.ReserveHost(d.UID, args.Node, d.Pod.Host)
		if err := s.postBinding(ctx, pod, args.Node, ""); err != nil {
			undo()
			return "", err
		}
		s.bound(pod, seen)
		return "", nil
	}
	entry, err := s.reserve(args.Node, &d)
	if err != nil {
		return "", err
	}
	sent := s.clock.Now()
	if err := s.postBinding(ctx, pod, args.Node, entry.Raw()); err != nil {
		outcome := bindImpossible
		if outcomeUnknown(err) {
			outcome = s.outcomeAfterAll(ctx, entry, pod)
		}
		switch outcome {
		case bindImpossible:
			s.state.Release(entry)
			return "", err
		case bindPending:
			return "", s.doubt(ctx, pod, entry, sent, err)
		}
	}
	s.bound(pod, seen)
	s.placed(pod, entry)
	return entry.Raw(), nil
}

// placed records the pod event of a placement, in the background: Bind
// makes no request for it.
func (s *Scheduler) placed(pod *corev1.Pod, entry *cluster.Entry) {
	s.events.Eventf(pod, corev1.EventTypeNormal, EventGPUsAssigned, "%s", placementMessage(entry.Allocation(), s.state.GPUModels(entry.Node())))
}

// podForBind returns the pod args name, from the informers' cache, or read
// from the API server when the cache has not seen it (or has an older pod
// of that name), and whether the cache has that pod (seen; as metadata
// only, for a pod that asks for no GPU, it is read in full all the same).
// It refuses pods that are replaced, bound or being deleted; the Binding's
// preconditions refuse them too, but without a request.
func (s *Scheduler) podForBind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (pod *corev1.Pod, seen bool, err error) {
	obj, seen := s.cachedPod(args.PodNamespace, args.PodName, args.PodUID)
	if p, ok := obj.(*gpuPod); ok {
		pod = p.pod()
	} else {
		s.metrics.bindPodReads.Inc()
		if pod, err = s.client.CoreV1().Pods(args.PodNamespace).Get(ctx, args.PodName, metav1.GetOptions{}); err != nil {
			return nil, false, fmt.Errorf("get pod %s/%s: %w", args.PodNamespace, args.PodName, err)
		}
	}
	switch {
	case pod.UID != args.PodUID:
		return nil, false, fmt.Errorf("pod %s/%s has UID %s, not %s: it was replaced", pod.Namespace, pod.Name, pod.UID, args.PodUID)
	case pod.Spec.NodeName != "":
		return nil, false, fmt.Errorf("pod %s/%s is already bound to node %q", pod.Namespace, pod.Name, pod.Spec.NodeName)
	case pod.DeletionTimestamp != nil:
		return nil, false, fmt.Errorf("pod %s/%s is being deleted", pod.Namespace, pod.Name)
	}
	return pod, seen, nil
}

// reserve fits d on node and counts it there as a reservation
// (cluster.State.Reserve). A pod reserved already is refused, with the
// doubt's message when its earlier Binding had an unknown outcome.
func (s *Scheduler) reserve(node string, d *cluster.Demand) (*cluster.Entry, error) {
	e, err := s.state.Reserve(node, d)
	var busy *cluster.BusyError
	if errors.As(err, &busy) {
		if b, ok := s.doubts.get(d.UID); ok && b.entry == busy.Entry {
			return nil, fmt.Errorf("an earlier Binding of this pod to node %s had an unknown outcome (%w): %s", busy.Entry.Node(), ErrBindInDoubt, doubtMessage(busy.Entry.Node(), b.until))
		}
	}
	return e, err
}

// postBinding binds pod to node, with pod's UID as precondition and, when
// allocation is not empty, the allocation annotation, which the API server
// sets on the pod together with spec.nodeName.
func (s *Scheduler) postBinding(ctx context.Context, pod *corev1.Pod, node, allocation string) error {
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	if allocation != "" {
		b.Annotations = map[string]string{vgpu.AnnotationPodAllocation: allocation}
	}
	if err := s.client.CoreV1().Pods(pod.Namespace).Bind(ctx, b, metav1.CreateOptions{FieldManager: fieldManager}); err != nil {
		return fmt.Errorf("bind pod %s/%s to node %s: %w", pod.Namespace, pod.Name, node, err)
	}
	return nil
}

// outcomeUnknown reports whether a failed Binding request may still have
// been carried out: no answer (timeout, connection lost), a server-side
// timeout, or a 5xx. A 4xx answer (conflict, not found, forbidden, invalid,
// too many requests) means the API server did not bind the pod, and so
// does a failed dial (the API server down: the request was never sent).
func outcomeUnknown(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		var op *net.OpError
		return !errors.As(err, &op) || op.Op != "dial"
	}
	// A server-side timeout is a 500 or a 504.
	code := status.Status().Code
	return code == 0 || code >= http.StatusInternalServerError || code == http.StatusRequestTimeout
}

// Back-off between outcomeAfterAll's reads of a pod while the API server
// does not answer (it restarts: the lost reply was likely its going down).
const (
	outcomeReadInitial = 100 * time.Millisecond
	outcomeReadMax     = time.Second
)

// outcomeAfterAll reads the pod after a Binding whose outcome is unknown
// and tells what the read says (readOutcome): bound to e's node with e's
// allocation, not bound yet, or never to be bound now. It runs on its own
// deadline (Config.BindTimeout), so a bind that failed by timing out can
// still tell, and reads again with back-off while the API server does not
// answer (bindPending when it never does): a bind reported failed that did
// land makes kube-scheduler place the pod again, and its cache then sees
// the pod on another node than it assumed (kube-scheduler exits on that).
func (s *Scheduler) outcomeAfterAll(ctx context.Context, e *cluster.Entry, pod *corev1.Pod) bindOutcome {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.BindTimeout.Duration)
	defer cancel()
	delay := outcomeReadInitial
	for {
		outcome, err := s.readOutcome(ctx, e, pod.Namespace, pod.Name)
		if err == nil {
			if outcome == bindLanded {
				logger.Info("Pod is bound after all; keeping its allocation")
			}
			return outcome
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			logger.Info("Could not read the pod after a bind with unknown outcome", "err", err.Error())
			return bindPending
		case <-timer.C:
		}
		delay = min(2*delay, outcomeReadMax)
	}
}

// bindGate bounds the binds waiting for the API client: at most max at
// once; the next is refused at once. Safe for concurrent use.
type bindGate struct {
	max     int64
	pending atomic.Int64
}

// enter admits one bind and returns the function that lets it out, or an
// error wrapping ErrOverloaded when max binds are pending.
func (g *bindGate) enter() (func(), error) {
	if g.pending.Add(1) > g.max {
		g.pending.Add(-1)
		return nil, fmt.Errorf("%w: %d binds are already waiting for the API client (maxPendingBinds); kube-scheduler retries the pod", ErrOverloaded, g.max)
	}
	return func() { g.pending.Add(-1) }, nil
}

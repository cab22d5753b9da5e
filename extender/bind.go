package extender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// fieldManager names the extender's writes on the API server.
const fieldManager = "gpuslice-scheduler"

// Bind places the pod on args.Node for kube-scheduler's bindVerb: it reads
// the pod fresh from the API server and checks its UID, fits it on the node
// against the informers' state plus the reservations of binds in progress,
// reserves the GPUs in memory, writes the allocation annotation (a JSON
// patch that fails if the pod changed since it was read) and posts the
// Binding. Binds to one node hold that node's lock only for the in-memory
// fit and reservation, so they never over-commit a GPU; binds to different
// nodes do not wait on each other. The reservation counts until the
// informers see the pod bound (then it counts as a bound pod) or deleted.
//
// On any failure it drops the reservation, removes the annotation again
// (best effort) and returns a result with Error; a pod that turns out to be
// bound to args.Node with its allocation after all counts as bound. The
// whole call is bounded by Config.BindTimeout. A pod that asks for no GPU
// is bound without an annotation. Each call with valid arguments is counted
// in MetricBinds by result. The error is non-nil, wrapping
// ErrBadArgs, only for arguments kube-scheduler never sends.
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
	value, err := s.bind(klog.NewContext(ctx, logger), args)
	elapsed := s.clock.Since(start)
	s.metrics.bindResult(err)
	if err != nil {
		reason := vgpu.Reason("APIError")
		var fe *vgpu.FitError
		if errors.As(err, &fe) {
			reason = fe.Reason
		}
		logger.Info("Bind failed", "reason", reason, "err", err.Error(), "duration", elapsed)
		return &extenderv1.ExtenderBindingResult{Error: err.Error()}, nil
	}
	logger.Info("Bound pod", "allocation", value, "duration", elapsed)
	return &extenderv1.ExtenderBindingResult{}, nil
}

// bind does Bind's work and returns the allocation annotation written ("" for
// a pod without GPUs).
func (s *Scheduler) bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (string, error) {
	pods := s.client.CoreV1().Pods(args.PodNamespace)
	pod, err := pods.Get(ctx, args.PodName, metav1.GetOptions{})
	switch {
	case err != nil:
		return "", fmt.Errorf("get pod %s/%s: %w", args.PodNamespace, args.PodName, err)
	case pod.UID != args.PodUID:
		return "", fmt.Errorf("pod %s/%s has UID %s, not %s: it was replaced", pod.Namespace, pod.Name, pod.UID, args.PodUID)
	case pod.Spec.NodeName != "":
		return "", fmt.Errorf("pod %s/%s is already bound to node %q", pod.Namespace, pod.Name, pod.Spec.NodeName)
	case pod.DeletionTimestamp != nil:
		return "", fmt.Errorf("pod %s/%s is being deleted", pod.Namespace, pod.Name)
	}
	d, err := demandOf(pod)
	if err != nil {
		return "", err
	}
	if !d.wantsGPU() {
		return "", s.postBinding(ctx, pod, args.Node)
	}
	entry, err := s.reserve(args.Node, &d)
	if err != nil {
		return "", err
	}
	err = s.writeAllocation(ctx, pod, entry.raw)
	if err == nil {
		err = s.postBinding(ctx, pod, args.Node)
	}
	if err != nil {
		if s.undo(ctx, entry, pod) {
			return entry.raw, nil
		}
		return "", err
	}
	return entry.raw, nil
}

// reserve fits d on node and counts it there as a reservation. It holds the
// node's bind lock throughout, so binds to one node reserve one at a time;
// the fit itself runs under the state's read lock and is repeated under
// the write lock only if the node's usage changed in between.
func (s *Scheduler) reserve(node string, d *demand) (*podEntry, error) {
	unlock := s.bindLocks.lock(node)
	defer unlock()
	st := s.state
	now := s.clock.Now()
	st.mu.RLock()
	v, gen, err := s.checkLocked(node, d, now)
	st.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.nodes[node].gen != gen {
		if v, _, err = s.checkLocked(node, d, now); err != nil {
			return nil, err
		}
	}
	raw, err := vgpu.EncodePodAllocation(v.placement.Allocation)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	st.removeLocked(st.pods[d.uid]) // a stale count of this pod
	e := &podEntry{
		uid: d.uid, node: node,
		raw: raw, alloc: v.placement.Allocation, req: d.pod.Request, reserved: true,
	}
	st.addLocked(e)
	return e, nil
}

// checkLocked fits d on node and returns the verdict and the node's usage
// generation it saw. Callers hold st.mu.
func (s *Scheduler) checkLocked(node string, d *demand, now time.Time) (verdict, uint64, error) {
	if e := s.state.pods[d.uid]; e != nil && e.reserved {
		return verdict{}, 0, fmt.Errorf("a bind of this pod to node %s is already in progress", e.node)
	}
	v := s.evaluateLocked(node, d, now)
	if !v.fits {
		return v, 0, fmt.Errorf("node %s: %w", node, &vgpu.FitError{Reason: v.reason, Message: v.message})
	}
	return v, s.state.nodes[node].gen, nil
}

// writeAllocation adds the allocation annotation to pod with a JSON patch
// that first tests the pod's UID and resourceVersion, so it fails if the
// pod was replaced or changed since it was read.
func (s *Scheduler) writeAllocation(ctx context.Context, pod *corev1.Pod, value string) error {
	ops := preconditions(pod)
	if len(pod.Annotations) == 0 {
		ops = append(ops, patchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{vgpu.AnnotationPodAllocation: value}})
	} else {
		ops = append(ops, patchOp{Op: "add", Path: annotationPath, Value: value})
	}
	if err := s.patch(ctx, pod, ops); err != nil {
		return fmt.Errorf("write %s: %w", vgpu.AnnotationPodAllocation, err)
	}
	return nil
}

// postBinding binds pod to node, with pod's UID as precondition.
func (s *Scheduler) postBinding(ctx context.Context, pod *corev1.Pod, node string) error {
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	if err := s.client.CoreV1().Pods(pod.Namespace).Bind(ctx, b, metav1.CreateOptions{FieldManager: fieldManager}); err != nil {
		return fmt.Errorf("bind pod %s/%s to node %s: %w", pod.Namespace, pod.Name, node, err)
	}
	return nil
}

// undo cleans up after a failed bind of e: unless the pod turns out to be
// bound to e's node with e's allocation after all (a reply lost after the
// API server acted), it drops the reservation and removes the annotation
// if the unbound pod still carries exactly e's. It reports whether the pod
// is bound after all. It runs on its own deadline, so a bind that failed by
// timing out still cleans up.
func (s *Scheduler) undo(ctx context.Context, e *podEntry, pod *corev1.Pod) bool {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.BindTimeout.Duration)
	defer cancel()
	cur, err := s.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err == nil && cur.UID == e.uid && cur.Spec.NodeName == e.node && cur.Annotations[vgpu.AnnotationPodAllocation] == e.raw {
		logger.Info("Pod is bound after all; keeping its allocation")
		return true
	}
	s.state.release(e)
	switch {
	case apierrors.IsNotFound(err):
		return false
	case err != nil:
		logger.Info("Could not read the pod to remove its allocation annotation", "err", err.Error())
		return false
	case cur.UID != e.uid || cur.Spec.NodeName != "" || cur.Annotations[vgpu.AnnotationPodAllocation] != e.raw:
		return false
	}
	ops := append(preconditions(cur),
		patchOp{Op: "test", Path: annotationPath, Value: e.raw},
		patchOp{Op: "remove", Path: annotationPath})
	if err := s.patch(ctx, cur, ops); err != nil {
		logger.Info("Could not remove the allocation annotation of a failed bind", "err", err.Error())
	}
	return false
}

// patchOp is one RFC 6902 operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// annotationPath is the JSON pointer (RFC 6901) of the allocation
// annotation: "~" and "/" in the key are escaped.
var annotationPath = "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(vgpu.AnnotationPodAllocation)

// preconditions tests pod's UID and, when it has one, resourceVersion.
func preconditions(pod *corev1.Pod) []patchOp {
	ops := []patchOp{{Op: "test", Path: "/metadata/uid", Value: pod.UID}}
	if pod.ResourceVersion != "" {
		ops = append(ops, patchOp{Op: "test", Path: "/metadata/resourceVersion", Value: pod.ResourceVersion})
	}
	return ops
}

func (s *Scheduler) patch(ctx context.Context, pod *corev1.Pod, ops []patchOp) error {
	body, err := json.Marshal(ops)
	if err != nil {
		return fmt.Errorf("encode patch: %w", err)
	}
	_, err = s.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, body, metav1.PatchOptions{FieldManager: fieldManager})
	return err
}

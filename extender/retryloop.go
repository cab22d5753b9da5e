package extender

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/extender/cluster"
	"github.com/gpuslice/gpuslice/extender/retry"
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

// retryLoop sets AnnotationRetry on the pods that wait since before a
// change, retry.Delay after it, until ctx ends.
func (s *Scheduler) retryLoop(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("retry")
	later := time.NewTimer(time.Hour)
	later.Stop()
	defer later.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.retries.Wake():
		case <-later.C:
		}
		pause := time.NewTimer(retry.Delay)
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
				logger.V(2).Info("Asked kube-scheduler to retry a pod", "pod", klog.KRef(p.Namespace, p.Name), "changedAt", at)
			case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsInvalid(err):
				// Gone, or replaced by a pod of the same name (a Filter
				// that ran while the informer saw it go can have
				// recorded it again).
				s.retries.Forget(p.UID)
			case ctx.Err() != nil:
				return
			default:
				s.retries.Failed(p)
				logger.Info("Could not ask kube-scheduler to retry a pod; trying again in the next pass", "pod", klog.KRef(p.Namespace, p.Name), "err", err.Error())
			}
		}
	}
}

// dueRetries is retries.Due with fits judging, under the state's read
// lock, whether the waiting pod fits the node now.
func (s *Scheduler) dueRetries() (at time.Time, pods []retry.Pod, again time.Duration) {
	now := s.clock.Now()
	s.state.Judging(now, func(fits func(d *cluster.Demand, node int) bool) {
		at, pods, again = s.retries.Due(now, fits)
	})
	return at, pods, again
}

// askRetry sets AnnotationRetry on the waiting pod, with its UID as
// precondition (a merge patch cannot change the UID, so a pod recreated
// under the same name refuses it). A pod bound since gets the annotation
// too, harmlessly.
func (s *Scheduler) askRetry(ctx context.Context, p retry.Pod, at time.Time) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         p.UID,
		"annotations": map[string]string{AnnotationRetry: at.UTC().Format(time.RFC3339Nano)},
	}})
	if err != nil {
		return fmt.Errorf("encode patch: %w", err)
	}
	_, err = s.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: fieldManager})
	return err
}

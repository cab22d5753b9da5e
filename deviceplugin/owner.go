package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Event reasons the plugin reports on pods whose containers it refuses to
// start.
const (
	// ReasonAllocationMissing: the pod or container has no allocation the
	// plugin can read (no annotation, not scheduled by gpuslice).
	ReasonAllocationMissing = "GPUAllocationMissing"
	// ReasonAllocationMismatch: the allocation does not fit the devices
	// the kubelet gave the container, or the devices were meant for
	// another container.
	ReasonAllocationMismatch = "GPUAllocationMismatch"
	// ReasonAllocationInvalid: the allocation annotation does not parse.
	ReasonAllocationInvalid = "GPUAllocationInvalid"
	// ReasonSpecWriteFailed: the CDI spec could not be written.
	ReasonSpecWriteFailed = "GPUSpecWriteFailed"
)

// errNoOwner means no container holds exactly the given device IDs.
var errNoOwner = errors.New("no container holds exactly these devices")

// jitter spreads d over [d/2, 3d/2).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d) //nolint:gosec // G404: back-off jitter, not security.
}

// findOwner asks the kubelet's PodResources API which container holds
// exactly ids (sorted, no repeats) of the plugin's resource. Failed calls
// (the API's rate limit, a kubelet restarting) are retried with jittered
// back-off until ctx ends; an answer without an owner is asked again for
// OwnerWait. Two owners of one set would be a kubelet bug and are an error.
func (a *allocator) findOwner(ctx context.Context, ids []string) (containerRef, error) {
	began := a.clock.Now()
	delay := a.t.RetryInitial
	var last error
	for attempt := 1; ; attempt++ {
		pods, err := a.lister.List(ctx)
		if err == nil {
			var owners []containerRef
			for ref, held := range containerDevices(pods, a.cfg.ResourceName) {
				if slices.Equal(held, ids) {
					owners = append(owners, ref)
				}
			}
			switch {
			case len(owners) == 1:
				return owners[0], nil
			case len(owners) > 1:
				slices.SortFunc(owners, func(x, y containerRef) int { return strings.Compare(x.String(), y.String()) })
				return containerRef{}, fmt.Errorf("devices %v are held by %d containers (%v): the kubelet's PodResources answer is inconsistent", ids, len(owners), owners)
			}
			last = errNoOwner
			if a.clock.Since(began) >= a.t.OwnerWait {
				break
			}
		} else {
			last = err
			a.logger.V(2).Info("PodResources List failed; retrying", "attempt", attempt, "err", err.Error())
		}
		if !a.sleep(ctx, delay) {
			break
		}
		delay = min(2*delay, a.t.RetryMax)
	}
	if errors.Is(last, errNoOwner) {
		return containerRef{}, fmt.Errorf("%w %v of %s in the kubelet's PodResources API (regular init containers are not listed there: request GPUs in app or sidecar containers)", errNoOwner, ids, a.cfg.ResourceName)
	}
	return containerRef{}, fmt.Errorf("find the container holding devices %v: %w", ids, last)
}

// refusal is a reason to refuse a container start, reported as a Warning
// event on the pod (when known) and as the PreStartContainer error.
type refusal struct {
	Reason string
	Ref    containerRef
	Pod    *corev1.Pod // nil when the pod is not in the view
	Err    error
}

func (r *refusal) Error() string { return r.Err.Error() }
func (r *refusal) Unwrap() error { return r.Err }

func refuse(reason string, ref containerRef, pod *corev1.Pod, format string, args ...any) *refusal {
	return &refusal{Reason: reason, Ref: ref, Pod: pod, Err: fmt.Errorf(format, args...)}
}

// podAllocation waits until the pod view shows ref's pod with a readable
// allocation for this node, or until ctx ends, and returns the pod and
// ref's container allocation. The view may lag the kubelet by a moment:
// absence and a missing annotation are waited out, a malformed or foreign
// allocation is not. When the view has not shown it within OwnerWait
// (its watch backs off while the API server restarts), the API server's
// pod of that name is read once and taken if it has an allocation.
func (a *allocator) podAllocation(ctx context.Context, ref containerRef) (*corev1.Pod, vgpu.ContainerAllocation, error) {
	if a.pods == nil {
		return nil, vgpu.ContainerAllocation{}, errNoPodView
	}
	ownerWait := a.clock.NewTimer(a.t.OwnerWait) // fires once: one read
	defer ownerWait.Stop()
	for {
		changed := a.pods.Changed()
		pod, ok := a.pods.Pod(ref.Namespace, ref.Pod)
		if ok {
			if alloc, ok, err := a.pods.Allocation(pod); ok {
				return a.containerAllocation(ref, pod, alloc, err)
			}
		}
		select {
		case <-changed:
			continue
		case <-ownerWait.C():
			// A pod the API server has with an allocation is served, or
			// refused for that allocation; otherwise the view is waited for.
			current, ca, err := a.livePodAllocation(ctx, ref)
			if r := (*refusal)(nil); err == nil || errors.As(err, &r) {
				a.logger.Info("Pod view lags for longer than the owner wait: using the pod the API server has", "container", ref)
				return current, ca, err
			}
			continue
		case <-ctx.Done():
		}
		if !ok {
			return nil, vgpu.ContainerAllocation{}, refuse(ReasonAllocationMissing, ref, nil,
				"pod %s/%s is not in the plugin's view of node %s (waited for the API server's pod list)", ref.Namespace, ref.Pod, a.cfg.NodeName)
		}
		return nil, vgpu.ContainerAllocation{}, refuse(ReasonAllocationMissing, ref, pod,
			"pod %s/%s has no %s annotation: it was not scheduled by the gpuslice scheduler extender", ref.Namespace, ref.Pod, vgpu.AnnotationPodAllocation)
	}
}

// containerAllocation reads ref's container from pod's allocation, alloc
// as parsed with err.
func (a *allocator) containerAllocation(ref containerRef, pod *corev1.Pod, alloc vgpu.PodAllocation, err error) (*corev1.Pod, vgpu.ContainerAllocation, error) {
	if err != nil {
		return nil, vgpu.ContainerAllocation{}, refuse(ReasonAllocationInvalid, ref, pod, "pod %s/%s: %w", ref.Namespace, ref.Pod, err)
	}
	if alloc.Node != a.cfg.NodeName {
		return nil, vgpu.ContainerAllocation{}, refuse(ReasonAllocationMismatch, ref, pod,
			"pod %s/%s: its allocation is for node %q, but it runs on node %q", ref.Namespace, ref.Pod, alloc.Node, a.cfg.NodeName)
	}
	ca, ok := alloc.Container(ref.Container)
	if !ok {
		return nil, vgpu.ContainerAllocation{}, refuse(ReasonAllocationMissing, ref, pod,
			"pod %s/%s: its allocation has no entry for container %q", ref.Namespace, ref.Pod, ref.Container)
	}
	return pod, ca, nil
}

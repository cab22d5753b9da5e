package deviceplugin

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// allocateEnv answers Allocate in mode env with the container's
// environment and mounts; device is handoff.DeviceName(ids). Allocate carries no pod identity, so the
// container is the one GetPreferredAllocation offered exactly these IDs
// to, if it is still pending, else the first pending container of a pod
// the kubelet lists whose allocation is on exactly the GPUs behind the
// IDs, confirmed with the API server (confirmPending). It waits for the
// pod view up to the start budget, then fails (the kubelet rejects the
// pod).
// The choice is checkpointed as a binding before the answer, so that
// PreStartContainer can verify it on every start, across plugin restarts.
func (a *allocator) allocateEnv(ctx context.Context, ids, gpus []string, device string) (*pluginapi.ContainerAllocateResponse, error) {
	if a.pods == nil {
		return nil, status.Error(codes.FailedPrecondition, errNoPodView.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, a.t.Budget)
	defer cancel()
	if !a.waitSynced(ctx) {
		return nil, status.Error(codes.Unavailable, "the plugin has not listed the node's pods yet (API server unreachable?)")
	}
	// Bindings still rule out the containers allocated before when
	// PodResources does not answer.
	held, listed := a.kubeletPods(ctx)
	c, ok := a.waitPending(ctx, func() (pendingContainer, bool) { return a.envMatch(ctx, device, ids, gpus, held, listed) })
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition,
			"no pending container on node %s was placed by the scheduler on GPUs %v (devices %v): mode env needs the pod's %d-GPU allocation on exactly these GPUs",
			a.cfg.NodeName, gpus, ids, len(ids))
	}
	return a.bindEnv(c, ids, device)
}

// envMatch picks the container for ids (see allocateEnv) among the
// pending containers of the pods the kubelet lists (admittedPending), each
// confirmed with the API server (confirmPending) before it is taken.
func (a *allocator) envMatch(ctx context.Context, device string, ids, gpus []string, held map[containerRef][]string, listed map[types.NamespacedName]bool) (pendingContainer, bool) {
	pending, _ := a.admittedPending(ctx, held, listed)
	if o, ok := a.claims.offered(device); ok {
		for _, c := range pending {
			if c.Ref == o.Ref && c.Pod.UID == o.PodUID && len(c.Alloc.GPUs) == len(ids) {
				if c, ok := a.confirmPending(ctx, c, ids, gpus, held); ok {
					return c, true
				}
			}
		}
	}
	for _, c := range pending {
		if allocationFits(c.Alloc, ids, gpus) {
			if c, ok := a.confirmPending(ctx, c, ids, gpus, held); ok {
				return c, true
			}
		}
	}
	return pendingContainer{}, false
}

// confirmPending confirms c, the container envMatch picked from the pod
// view, with the API server's pod of that name (one GET), since mode env
// answers Allocate with the environment itself and the kubelet replays it
// at every start: while the view lags, a pod deleted and created again
// under the same name (a StatefulSet's web-0) still shows there as the old
// pod, pending, with the old allocation (PodResources names pods by
// namespace and name only). It returns c when the API server has that
// very pod (or cannot be read: the starts then confirm the binding's pod,
// confirmBinding), the API server's pod's pending container instead when
// it is another pod whose allocation fits ids on gpus, and false when
// there is no such pod or it does not fit.
func (a *allocator) confirmPending(ctx context.Context, c pendingContainer, ids, gpus []string, held map[containerRef][]string) (pendingContainer, bool) {
	if a.livePod == nil {
		return c, true
	}
	current, err := a.currentPod(ctx, c.Ref)
	switch {
	case errors.Is(err, errPodGone):
		return pendingContainer{}, false
	case err != nil:
		a.logger.Info("Allocate in mode env: the API server did not confirm the pod; its container's starts confirm it", "container", c.Ref, "podUID", c.Pod.UID, "err", err.Error())
		return c, true
	case current.UID == c.Pod.UID:
		return c, true
	}
	for _, cc := range a.pendingContainers([]*corev1.Pod{current}, held) {
		if allocationFits(cc.Alloc, ids, gpus) {
			a.logger.Info("Pod view lags: Allocate in mode env answers for the pod the API server has", "container", cc.Ref, "viewUID", c.Pod.UID, "podUID", current.UID)
			return cc, true
		}
	}
	return pendingContainer{}, false
}

// bindEnv checkpoints c as the owner of ids and returns its environment.
func (a *allocator) bindEnv(c pendingContainer, ids []string, device string) (*pluginapi.ContainerAllocateResponse, error) {
	edits, err := a.editsFor(c.Pod, c.Alloc)
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	b := claim{Device: device, DeviceIDs: ids, Ref: c.Ref, PodUID: c.Pod.UID, At: a.clock.Now()}
	if err := a.claims.bind(b); err != nil {
		return nil, status.Errorf(codes.Internal, "record the allocation of devices %v to %s: %v", ids, c.Ref, err)
	}
	a.logger.V(2).Info("Allocated in mode env", "container", c.Ref, "podUID", c.Pod.UID, "devices", ids)
	resp := &pluginapi.ContainerAllocateResponse{Envs: make(map[string]string, len(edits.Env))}
	for _, v := range edits.Env {
		resp.Envs[v.Name] = v.Value
	}
	for _, m := range edits.Mounts {
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: !m.Writable})
	}
	for _, name := range a.nvidiaDevicesFor(allocationGPUs(c.Alloc)) {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: name})
	}
	return resp, nil
}

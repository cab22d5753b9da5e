package deviceplugin

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// allocateEnv answers Allocate in mode env with the container's
// environment and mounts; device is handoff.DeviceName(ids). Allocate carries no pod identity, so the
// container is the one GetPreferredAllocation offered exactly these IDs
// to, if it is still pending, else the first pending container of a pod
// the kubelet lists whose allocation is on exactly the GPUs behind the
// IDs. It waits for the pod
// view up to the start budget, then fails (the kubelet rejects the pod).
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
// pending containers of the pods the kubelet lists (admittedPending).
func (a *allocator) envMatch(ctx context.Context, device string, ids, gpus []string, held map[containerRef][]string, listed map[types.NamespacedName]bool) (pendingContainer, bool) {
	pending, _ := a.admittedPending(ctx, held, listed)
	if o, ok := a.claims.offered(device); ok {
		for _, c := range pending {
			if c.Ref == o.Ref && c.Pod.UID == o.PodUID && len(c.Alloc.GPUs) == len(ids) {
				return c, true
			}
		}
	}
	for _, c := range pending {
		if allocationFits(c.Alloc, ids, gpus) {
			return c, true
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

package deviceplugin

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// EnvVisibleDevices is the variable the NVIDIA container runtime reads to
// decide which GPUs a container sees.
const EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"

// allocator turns granted virtual device IDs into container settings.
type allocator struct {
	inv    *inventory
	logger klog.Logger
}

// allocate maps each container's device IDs to their physical GPUs and
// exposes those GPUs (whole-GPU semantics). Unknown IDs are an
// InvalidArgument error naming the ID; nothing is half-answered.
func (a *allocator) allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, 0, len(req.GetContainerRequests()))}
	for _, creq := range req.GetContainerRequests() {
		gpus, err := a.gpusOf(creq.GetDevicesIds())
		if err != nil {
			return nil, err
		}
		uuids := make([]string, len(gpus))
		for i, g := range gpus {
			uuids[i] = g.UUID
		}
		a.logger.V(2).Info("Allocate", "devices", creq.GetDevicesIds(), "gpus", uuids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{EnvVisibleDevices: strings.Join(uuids, ",")},
		})
	}
	return resp, nil
}

// gpusOf returns the distinct GPUs behind ids, ordered by NVML index.
func (a *allocator) gpusOf(ids []string) ([]vgpu.GPU, error) {
	var gpus []vgpu.GPU
	for _, id := range ids {
		uuid, ok := GPUOfDeviceID(id)
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "device ID %q was not made by this plugin (want <GPU UUID>%s<slice>)", id, deviceIDSeparator)
		}
		g, ok := a.inv.gpu(uuid)
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "device ID %q names GPU %s, which this node does not advertise", id, uuid)
		}
		if !slices.ContainsFunc(gpus, func(x vgpu.GPU) bool { return x.UUID == uuid }) {
			gpus = append(gpus, g)
		}
	}
	slices.SortFunc(gpus, func(x, y vgpu.GPU) int { return cmp.Compare(x.Index, y.Index) })
	return gpus, nil
}

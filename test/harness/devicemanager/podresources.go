package devicemanager

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"testing"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	kubeletdevicemanager "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// ServePodResources serves the kubelet's own PodResources v1 server
// (k8s.io/kubernetes/pkg/kubelet/apis/podresources, behind the kubelet's rate limiter of 100 calls/s
// with a burst of 10) on the unix socket at socket, fed by this manager: the active pods, and the
// devices the manager assigned to their containers, listed one entry per device and NUMA node as
// the kubelet's container manager does. Like the kubelet's, its List frees the devices of pods that
// are no longer active. t.Cleanup stops the server; the socket path must fit in 107 bytes.
func (m *Manager) ServePodResources(t testing.TB, socket string) {
	t.Helper()
	if len(socket) > maxSocketPathLen {
		t.Fatalf("devicemanager: PodResources socket path %q is %d bytes, longer than the %d a unix socket allows", socket, len(socket), maxSocketPathLen)
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("devicemanager: remove old PodResources socket: %v", err)
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatalf("devicemanager: listen for PodResources on %s: %v", socket, err)
	}
	ctx := klog.NewContext(context.Background(), m.logger.WithName("podresources"))
	server := grpc.NewServer(apisgrpc.WithRateLimiter(ctx, "podresources", podresources.DefaultQPS, podresources.DefaultBurstTokens))
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, podresources.PodResourcesProviders{
		Pods:             podsProvider{m},
		Devices:          devicesProvider{m.impl},
		Cpus:             noCPUs{},
		Memory:           noMemory{},
		DynamicResources: noDynamicResources{},
	}))
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = server.Serve(lis)
	}()
	t.Cleanup(func() {
		server.Stop()
		<-served
	})
}

// podsProvider lists the manager's active pods, as the kubelet's pod manager would.
type podsProvider struct{ m *Manager }

func (p podsProvider) GetActivePods() []*corev1.Pod { return p.m.activePods() }
func (p podsProvider) GetPods() []*corev1.Pod       { return p.m.activePods() }
func (p podsProvider) GetPodByName(namespace, name string) (*corev1.Pod, bool) {
	pods := p.m.activePods()
	i := slices.IndexFunc(pods, func(pod *corev1.Pod) bool { return pod.Namespace == namespace && pod.Name == name })
	if i < 0 {
		return nil, false
	}
	return pods[i], true
}

// devicesProvider adapts the device manager to the PodResources server, as the kubelet's container
// manager does.
type devicesProvider struct {
	impl *kubeletdevicemanager.ManagerImpl
}

func (d devicesProvider) UpdateAllocatedDevices(logger klog.Logger) {
	d.impl.UpdateAllocatedDevices(logger)
}

func (d devicesProvider) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return containerDevices(d.impl.GetDevices(podUID, containerName))
}

func (d devicesProvider) GetAllocatableDevices(logger klog.Logger) []*podresourcesapi.ContainerDevices {
	return containerDevices(d.impl.GetAllocatableDevices(logger))
}

// containerDevices lists one entry per device and NUMA node (one without topology when the plugin
// reports none), the shape the kubelet's PodResources API answers with.
func containerDevices(devs kubeletdevicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resource, instances := range devs {
		for id, dev := range instances {
			nodes := dev.GetTopology().GetNodes()
			if len(nodes) == 0 {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}})
				continue
			}
			for _, n := range nodes {
				out = append(out, &podresourcesapi.ContainerDevices{
					ResourceName: resource,
					DeviceIds:    []string{id},
					Topology:     &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: n.GetID()}}},
				})
			}
		}
	}
	return out
}

// noCPUs, noMemory and noDynamicResources stand in for the managers the harness does not run.
type noCPUs struct{}

func (noCPUs) GetCPUs(*corev1.Pod, *corev1.Container) []int64 { return nil }
func (noCPUs) GetPodCPUs(string) []int64                      { return nil }
func (noCPUs) GetAllocatableCPUs() []int64                    { return nil }

type noMemory struct{}

func (noMemory) GetMemory(klog.Logger, *corev1.Pod, *corev1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (noMemory) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory { return nil }

type noDynamicResources struct{}

func (noDynamicResources) GetDynamicResources(klog.Logger, *corev1.Pod, *corev1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

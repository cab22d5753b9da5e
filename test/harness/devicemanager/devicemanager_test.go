package devicemanager_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/test/harness/devicemanager"
)

const resourceName = "example.com/dev"

// stubPlugin is a minimal device plugin: a fixed list of healthy devices, and an Allocate that
// puts the allocated IDs in EXAMPLE_DEVICES and the plugin's name in EXAMPLE_PLUGIN.
type stubPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	name    string
	devices []string
}

func (p *stubPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *stubPlugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for _, id := range p.devices {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := stream.Send(resp); err != nil {
		return fmt.Errorf("send device list: %w", err)
	}
	<-stream.Context().Done()
	return nil
}

func (p *stubPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{
				"EXAMPLE_DEVICES": strings.Join(c.DevicesIds, ","),
				"EXAMPLE_PLUGIN":  p.name,
			},
		})
	}
	return resp, nil
}

// servePlugin serves p on pluginDir/name, then registers it with the kubelet socket: serve first,
// since Register dials the plugin back before it returns.
func servePlugin(t *testing.T, kubeletSocket, pluginDir, name string, p *stubPlugin) {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(pluginDir, name))
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve plugin: %v", err)
		}
	})

	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial kubelet: %v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     name,
		ResourceName: resourceName,
	})
	if err != nil {
		t.Fatalf("register: %v", err)
	}
}

func TestManagerRegistersAndAllocates(t *testing.T) {
	pluginDir, err := os.MkdirTemp("", "dm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(pluginDir) })

	m := devicemanager.Start(t, pluginDir)
	if got, want := m.SocketPath(), filepath.Join(pluginDir, "kubelet.sock"); got != want {
		t.Errorf("SocketPath() = %q, want %q", got, want)
	}
	servePlugin(t, m.SocketPath(), pluginDir, "example.sock", &stubPlugin{name: "stub", devices: []string{"dev-0", "dev-1"}})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.WaitResource(ctx, resourceName, 2, 2); err != nil {
		t.Fatal(err)
	}

	pod := podWithDevices("p", 2)
	if err := m.Allocate(pod, &pod.Spec.Containers[0]); err != nil {
		t.Fatal(err)
	}
	env, err := m.ContainerEnv(pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	if got, want := env["EXAMPLE_PLUGIN"], "stub"; got != want {
		t.Errorf("EXAMPLE_PLUGIN = %q, want %q", got, want)
	}
	// The manager hands out devices in no particular order.
	ids := strings.Split(env["EXAMPLE_DEVICES"], ",")
	if len(ids) == 2 && ids[0] > ids[1] {
		ids[0], ids[1] = ids[1], ids[0]
	}
	if diff := cmp.Diff([]string{"dev-0", "dev-1"}, ids); diff != "" {
		t.Errorf("EXAMPLE_DEVICES (-want +got):\n%s", diff)
	}

	// A second pod finds no free device.
	other := podWithDevices("q", 1)
	if err := m.Allocate(other, &other.Spec.Containers[0]); err == nil {
		t.Errorf("Allocate for a second pod with every device taken: got no error")
	}
}

// TestManagerRestart restarts the kubelet: the new manager deletes the plugin's socket, reports no
// devices until the plugin registers again, and keeps a running pod's allocation from the
// checkpoint.
func TestManagerRestart(t *testing.T) {
	pluginDir, err := os.MkdirTemp("", "dm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(pluginDir) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod := podWithDevices("p", 1)

	first := devicemanager.Start(t, pluginDir)
	servePlugin(t, first.SocketPath(), pluginDir, "example.sock", &stubPlugin{name: "before", devices: []string{"dev-0"}})
	if err := first.WaitResource(ctx, resourceName, 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := first.Allocate(pod, &pod.Spec.Containers[0]); err != nil {
		t.Fatal(err)
	}
	first.Stop()
	first.Stop() // idempotent

	second := devicemanager.Start(t, pluginDir)
	second.MarkActive(pod) // still running across the restart
	if c, a := second.Resource(resourceName); c != 0 || a != 0 {
		t.Errorf("after restart Resource() = %d, %d; want 0, 0 until the plugin registers again", c, a)
	}
	if _, err := os.Stat(filepath.Join(pluginDir, "example.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plugin socket after restart: Stat() error = %v, want it deleted", err)
	}
	servePlugin(t, second.SocketPath(), pluginDir, "example-2.sock", &stubPlugin{name: "after", devices: []string{"dev-0"}})
	if err := second.WaitResource(ctx, resourceName, 1, 1); err != nil {
		t.Fatal(err)
	}
	env, err := second.ContainerEnv(pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	// The cached Allocate response is replayed: the plugin is not asked again.
	want := map[string]string{"EXAMPLE_DEVICES": "dev-0", "EXAMPLE_PLUGIN": "before"}
	if diff := cmp.Diff(want, env); diff != "" {
		t.Errorf("env after restart (-want +got):\n%s", diff)
	}
	other := podWithDevices("q", 1)
	if err := second.Allocate(other, &other.Spec.Containers[0]); err == nil {
		t.Errorf("Allocate with the only device held by a running pod: got no error")
	}
}

func podWithDevices(name string, count int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				resourceName: *resource.NewQuantity(count, resource.DecimalSI),
			}},
		}}},
	}
}

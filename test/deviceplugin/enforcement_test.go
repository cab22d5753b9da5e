package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// toolkitSpecs is the folder of nvidia-toolkit.yaml, a CDI spec as
// NVIDIA's container toolkit writes it (devices named by index, its
// memory-limit hook), shared with the device plugin's unit tests.
var toolkitSpecs = filepath.Join("..", "..", "deviceplugin", "testdata")

// TestEnforcementDriverOnTheKubelet: on the real device manager, a node
// with the driver mechanism and the toolkit's CDI spec hands a container
// gpuslice's CDI device and the toolkit's device of its GPU; the runtime's
// CDI library, resolving both, gives it the driver's memory-limit
// variables and the toolkit's hook; and the pod gets an event naming the
// mechanism.
func TestEnforcementDriverOnTheKubelet(t *testing.T) {
	t.Parallel()
	h := newHandoffEnv(t, deviceplugin.ModeCDI)
	toolkit, err := filepath.Abs(toolkitSpecs)
	if err != nil {
		t.Fatal(err)
	}
	pod := h.createPod("a", time.Now(), vgputest.Allocation(nodeName).Container("main").Slice(fakeGPU(2), 6144, 0))
	h.startWith(func(c *deviceplugin.Config) {
		c.Enforcement = "driver"
		c.NVIDIACDISpecs = []string{filepath.Join(toolkit, "nvidia*.yaml")}
	})
	if err := h.m.Allocate(pod, &pod.Spec.Containers[0]); err != nil {
		t.Fatalf("kubelet Allocate: %v", err)
	}
	opts, err := h.m.RunContainerOptions(pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	var devices []string
	for _, d := range opts.CDIDevices {
		devices = append(devices, d.Name)
	}
	if len(devices) != 2 || !strings.HasPrefix(devices[0], handoff.CDIKind+"=") || devices[1] != "nvidia.com/gpu=2" {
		t.Fatalf("CDI devices %v, want gpuslice's and nvidia.com/gpu=2", devices)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(filepath.Join(h.dir, "cdi"), toolkit), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache: %v", err)
	}
	env, err := injectEnv(cache.InjectDevices, devices...)
	if err != nil {
		t.Fatalf("resolve %v: %v", devices, err)
	}
	for _, want := range []string{handoff.EnvGPUMemoryRequest + "=6144", handoff.EnvGPUMemoryLimit + "=6144", "NVIDIA_TOOLKIT_GPU=2", handoff.EnvVisibleDevices + "=" + fakeGPU(2)} {
		if !slices.Contains(env, want) {
			t.Errorf("container env %v lacks %s", env, want)
		}
	}
	h.waitEvent("a", corev1.EventTypeNormal, handoff.ReasonEnforced, "enforcement driver: the NVIDIA driver limits GPU memory to 6144 MiB")
}

// TestDriverNeedsTheHookOnTheKubelet: on the real device manager, a node
// with driver R615 on cgroup v2 publishes driver (inventory and
// hami.io/enforcement label) only when the NVIDIA toolkit's CDI spec runs
// the memory-limit hook; without a spec, or with one without the hook, it
// publishes the mechanism it falls back to and a Warning Node event says
// why; with enforcementDriverHook=assume it publishes driver and the Node
// and container events say that it is unverified.
func TestDriverNeedsTheHookOnTheKubelet(t *testing.T) {
	t.Parallel()
	toolkit, err := filepath.Abs(filepath.Join(toolkitSpecs, "nvidia-toolkit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(toolkit)
	if err != nil {
		t.Fatal(err)
	}
	spec := string(data)
	hookless := spec[:strings.Index(spec, "containerEdits:\n  hooks:")]
	tests := []struct {
		name      string
		spec      string // the toolkit's spec on the node; empty: none
		mutate    func(*deviceplugin.Config)
		want      string
		nodeEvent string // type and message of the Node event
		podEvent  string
	}{
		{name: "no spec", want: "none",
			nodeEvent: "Warning enforcement none; driver is not offered: no NVIDIA container toolkit CDI spec found", podEvent: "enforcement none"},
		{name: "no hook", spec: hookless, mutate: func(c *deviceplugin.Config) { c.HostLibVGPU = "/opt/hami/libvgpu.so" }, want: "hami-core",
			nodeEvent: "Warning enforcement hami-core; driver is not offered: the NVIDIA container toolkit CDI specs do not run nvidia-cdi-hook apply-cuda-memory-limits", podEvent: "enforcement hami-core"},
		{name: "hook", spec: spec, want: "driver",
			nodeEvent: "Normal enforcement driver: the NVIDIA toolkit's CDI specs run nvidia-cdi-hook apply-cuda-memory-limits", podEvent: "enforcement driver: the NVIDIA driver limits GPU memory"},
		{name: "assume", mutate: func(c *deviceplugin.Config) { c.EnforcementDriverHook = handoff.DriverHookAssume }, want: "driver",
			nodeEvent: "Warning enforcement driver (unverified: no NVIDIA container toolkit CDI spec found", podEvent: "enforcement driver, unverified"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHandoffEnv(t, deviceplugin.ModeCDI)
			if _, err := h.client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			specs := t.TempDir()
			if tt.spec != "" {
				if err := os.WriteFile(filepath.Join(specs, "nvidia.yaml"), []byte(tt.spec), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			pod := h.createPod("a", time.Now(), vgputest.Allocation(nodeName).Container("main").Slice(fakeGPU(1), 2048, 0))
			h.startWith(func(c *deviceplugin.Config) {
				c.FakeGPUs = fakeGPUs + ";driver=615.20;cgroup=2"
				c.NVIDIACDISpecs = []string{filepath.Join(specs, "nvidia*.yaml")}
				if tt.mutate != nil {
					tt.mutate(c)
				}
			})
			waitUntil(t, waitLong, "the node's enforcement published as "+tt.want, func() bool {
				node, err := h.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
				if err != nil {
					return false
				}
				inv, err := vgpu.ParseNodeInventory(node.Annotations[vgpu.AnnotationNodeInventory])
				return err == nil && string(inv.Enforcement) == tt.want && node.Labels[vgpu.LabelEnforcement] == tt.want
			})
			eventType, message, _ := strings.Cut(tt.nodeEvent, " ")
			h.waitEvent(nodeName, eventType, handoff.ReasonEnforced, message)

			if err := h.m.Allocate(pod, &pod.Spec.Containers[0]); err != nil {
				t.Fatalf("kubelet Allocate: %v", err)
			}
			if _, err := h.m.RunContainerOptions(pod, &pod.Spec.Containers[0]); err != nil {
				t.Fatalf("start: %v", err)
			}
			h.waitEvent("a", corev1.EventTypeNormal, handoff.ReasonEnforced, tt.podEvent)
		})
	}
}

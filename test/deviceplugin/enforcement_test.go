package deviceplugin

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/node/handoff"
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

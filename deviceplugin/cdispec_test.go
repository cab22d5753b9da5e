package deviceplugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestCDIDeviceName(t *testing.T) {
	a, b := DeviceID(gpuA, 0), DeviceID(gpuB, 4)
	name := handoff.DeviceName([]string{a, b})
	if err := parser.ValidateDeviceName(name); err != nil {
		t.Errorf("handoff.DeviceName = %q, not a valid CDI device name: %v", name, err)
	}
	if len(name) != 1+handoff.NameHexLen || !strings.HasPrefix(name, "v") {
		t.Errorf("handoff.DeviceName = %q, want v + %d hex digits", name, handoff.NameHexLen)
	}
	if got := handoff.DeviceName([]string{b, a, b}); got != name {
		t.Errorf("order or repeats changed the name: %q, want %q", got, name)
	}
	if got := handoff.DeviceName([]string{a}); got == name {
		t.Errorf("a different set got the same name %q", got)
	}
	if got, ok := handoff.DeviceOfFile(handoff.SpecFileName(name)); !ok || got != name {
		t.Errorf("handoff.DeviceOfFile(%q) = %q, %v; want %q, true", handoff.SpecFileName(name), got, ok, name)
	}
	for _, other := range []string{"nvidia.com-gpu.json", "gpuslice.io-vgpu_x.yaml", ".gpuslice-1.tmp", "gpuslice.io-vgpu_.json"} {
		if _, ok := handoff.DeviceOfFile(other); ok {
			t.Errorf("handoff.DeviceOfFile(%q) claimed a foreign file", other)
		}
	}
}

// TestCDISpecContent runs Allocate and PreStartContainer for one
// container and compares the spec file the plugin writes, then resolves
// the device with the CDI library as a runtime would.
func TestCDISpecContent(t *testing.T) {
	idA, idB := DeviceID(gpuA, 0), DeviceID(gpuB, 4)
	const alloc = `[{"uuid":"` + gpuB + `","memoryMiB":20480,"coresPercent":30},{"uuid":"` + gpuA + `","memoryMiB":10240,"coresPercent":30}]`
	twoGPUEnv := []string{
		"NVIDIA_VISIBLE_DEVICES=" + gpuB + "," + gpuA,
		"CUDA_DEVICE_MEMORY_LIMIT_0=20480m",
		"CUDA_DEVICE_MEMORY_LIMIT_1=10240m",
		"CUDA_DEVICE_SM_LIMIT=30",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/gpuslice/uid-train-main.cache",
		"GPUSLICE_POD=default/train",
		"GPUSLICE_POD_UID=uid-train",
		"GPUSLICE_CONTAINER=main",
		"GPUSLICE_ALLOCATION=" + alloc,
	}
	twoGPUs := vgputest.Allocation("node-1").Container("main").Slice(gpuB, 20480, 30).Slice(gpuA, 10240, 30)
	libMounts := []*cdispecs.Mount{
		{HostPath: "/opt/hami/libvgpu.so", ContainerPath: "/usr/local/vgpu/libvgpu.so", Options: []string{"ro", "nosuid", "nodev", "bind"}},
		{HostPath: "STATE/ld.so.preload", ContainerPath: "/etc/ld.so.preload", Options: []string{"ro", "nosuid", "nodev", "bind"}},
	}
	tests := []struct {
		name        string
		mutate      func(*Config)
		alloc       *vgputest.AllocationBuilder
		ids         []string
		wantEnv     []string
		wantNodes   []string
		wantMounts  []*cdispecs.Mount
		wantVersion string
	}{
		{
			name: "two GPUs on real hardware", alloc: twoGPUs, ids: []string{idB, idA},
			wantEnv:     twoGPUEnv,
			wantNodes:   []string{"/dev/nvidia7", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"},
			wantVersion: "0.3.0",
		},
		{
			name: "fake GPUs have no device nodes", mutate: func(c *Config) { c.FakeGPUs = "2xA100-80GB" },
			alloc: twoGPUs, ids: []string{idA, idB}, wantEnv: twoGPUEnv, wantVersion: "0.3.0",
		},
		{
			name: "libvgpu mounted when configured", mutate: func(c *Config) { c.FakeGPUs = "2xA100-80GB"; c.HostLibVGPU = "/opt/hami/libvgpu.so" },
			alloc: twoGPUs, ids: []string{idA, idB}, wantEnv: twoGPUEnv, wantMounts: libMounts, wantVersion: "0.3.0",
		},
		{
			name: "no compute reserved: no SM limit", mutate: func(c *Config) { c.FakeGPUs = "2xA100-80GB"; c.SharedCacheDir = "/var/cache/hami" },
			alloc: vgputest.Allocation("node-1").Container("main").Slice(gpuA, 4096, 0), ids: []string{DeviceID(gpuA, 9)},
			wantEnv: []string{
				"NVIDIA_VISIBLE_DEVICES=" + gpuA,
				"CUDA_DEVICE_MEMORY_LIMIT_0=4096m",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE=/var/cache/hami/uid-train-main.cache",
				"GPUSLICE_POD=default/train",
				"GPUSLICE_POD_UID=uid-train",
				"GPUSLICE_CONTAINER=main",
				`GPUSLICE_ALLOCATION=[{"uuid":"` + gpuA + `","memoryMiB":4096,"coresPercent":0}]`,
			},
			wantVersion: "0.3.0",
		},
		{
			name: "whole GPU", mutate: func(c *Config) { c.FakeGPUs = "2xA100-80GB" },
			alloc: vgputest.Allocation("node-1").Container("main").Slice(gpuB, 81920, 100), ids: []string{DeviceID(gpuB, 0)},
			wantEnv: []string{
				"NVIDIA_VISIBLE_DEVICES=" + gpuB,
				"CUDA_DEVICE_MEMORY_LIMIT_0=81920m",
				"CUDA_DEVICE_SM_LIMIT=100",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/gpuslice/uid-train-main.cache",
				"GPUSLICE_POD=default/train",
				"GPUSLICE_POD_UID=uid-train",
				"GPUSLICE_CONTAINER=main",
				`GPUSLICE_ALLOCATION=[{"uuid":"` + gpuB + `","memoryMiB":81920,"coresPercent":100}]`,
			},
			wantVersion: "0.3.0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newHandoff(t, tt.mutate)
			f.addPod(gpuPod("train", time.Now(), allocOf(tt.alloc), "main"))
			cresp, err := f.allocate(tt.ids...)
			if err != nil {
				t.Fatal(err)
			}
			qualified := handoff.CDIQualifiedName(handoff.DeviceName(tt.ids))
			if got := cresp.GetCdiDevices(); len(got) != 1 || got[0].GetName() != qualified || len(cresp.GetEnvs()) != 0 {
				t.Fatalf("Allocate = %v, want only CDI device %s", cresp, qualified)
			}
			f.podRes.hold("default", "train", "main", tt.ids...)
			if err := f.preStart(tt.ids...); err != nil {
				t.Fatal(err)
			}

			want := &cdispecs.Spec{Version: tt.wantVersion, Kind: handoff.CDIKind, Devices: []cdispecs.Device{{
				Name:           handoff.DeviceName(tt.ids),
				ContainerEdits: cdispecs.ContainerEdits{Env: tt.wantEnv},
			}}}
			for _, n := range tt.wantNodes {
				want.Devices[0].ContainerEdits.DeviceNodes = append(want.Devices[0].ContainerEdits.DeviceNodes, &cdispecs.DeviceNode{Path: n})
			}
			for _, m := range tt.wantMounts {
				m := *m
				m.HostPath = strings.Replace(m.HostPath, "STATE", f.cfg.EffectiveStateDir(), 1)
				want.Devices[0].ContainerEdits.Mounts = append(want.Devices[0].ContainerEdits.Mounts, &m)
			}
			if diff := cmp.Diff(want, f.readSpec(tt.ids...)); diff != "" {
				t.Errorf("CDI spec (-want +got):\n%s", diff)
			}
			if len(tt.wantNodes) > 0 {
				return // the CDI library stats device nodes, which this machine lacks
			}
			got := f.inject(qualified)
			if diff := cmp.Diff(tt.wantEnv, got.Process.Env); diff != "" {
				t.Errorf("env injected by the CDI library (-want +got):\n%s", diff)
			}
			var mounts []string
			for _, m := range got.Mounts {
				mounts = append(mounts, m.Source+":"+m.Destination)
			}
			var wantMounts []string
			for _, m := range tt.wantMounts {
				wantMounts = append(wantMounts, strings.Replace(m.HostPath, "STATE", f.cfg.EffectiveStateDir(), 1)+":"+m.ContainerPath)
			}
			// The CDI library orders mounts by destination depth.
			if diff := cmp.Diff(sortedCopy(wantMounts), sortedCopy(mounts)); diff != "" {
				t.Errorf("mounts injected by the CDI library (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSpecRewrittenWhenDevicesMove: device IDs pass from pod to pod, and
// so does their CDI device name; the spec must always describe the
// current holder, and be replaced atomically.
func TestSpecRewrittenWhenDevicesMove(t *testing.T) {
	f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
	ids := []string{DeviceID(gpuA, 2)}
	qualified := handoff.CDIQualifiedName(handoff.DeviceName(ids))
	steps := []struct {
		pod      string
		memory   int64
		wantPod  string
		wantUID  string
		wantHeld string
	}{
		{pod: "a", memory: 1024, wantPod: "default/a", wantUID: "uid-a", wantHeld: "1024m"},
		{pod: "b", memory: 2048, wantPod: "default/b", wantUID: "uid-b", wantHeld: "2048m"},
	}
	prev := ""
	for _, s := range steps {
		if prev != "" {
			f.deletePod("default", prev)
			f.podRes.forget("default", prev)
		}
		prev = s.pod
		f.addPod(gpuPod(s.pod, time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, s.memory, 10)), "main"))
		f.podRes.hold("default", s.pod, "main", ids...)
		if err := f.preStart(ids...); err != nil {
			t.Fatalf("pod %s: %v", s.pod, err)
		}
		env := f.inject(qualified).Process.Env
		got := []string{envValue(env, handoff.EnvPod), envValue(env, handoff.EnvPodUID), envValue(env, handoff.EnvMemoryLimitPrefix+"0")}
		if diff := cmp.Diff([]string{s.wantPod, s.wantUID, s.wantHeld}, got); diff != "" {
			t.Errorf("after pod %s started: pod, UID, memory limit (-want +got):\n%s", s.pod, diff)
		}
	}
	if diff := cmp.Diff([]string{handoff.SpecFileName(handoff.DeviceName(ids))}, readDirNames(t, f.cfg.CDISpecDir)); diff != "" {
		t.Errorf("spec folder: one spec, no temporary files (-want +got):\n%s", diff)
	}
}

func TestWriteCDISpecRejectsInvalid(t *testing.T) {
	dir := t.TempDir()
	spec, err := handoff.BuildSpec("vabc", handoff.Edits{Env: []handoff.EnvVar{{Name: "A", Value: "1"}}})
	if err != nil {
		t.Fatal(err)
	}
	spec.Kind = "not a kind"
	if err := handoff.WriteSpec(dir, spec); err == nil {
		t.Fatal("handoff.WriteSpec accepted a spec with an invalid kind")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a rejected spec left %d files behind", len(entries))
	}
	if _, err := handoff.BuildSpec("bad name!", handoff.Edits{}); err == nil {
		t.Error("handoff.BuildSpec accepted an invalid device name")
	}
	if _, err := os.Stat(filepath.Join(dir, handoff.SpecFileName("vabc"))); err == nil {
		t.Error("the invalid spec was written")
	}
}

package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
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
			name := f.alloc.cdiDeviceOf(tt.ids)
			qualified := handoff.CDIQualifiedName(name)
			if got := cresp.GetCdiDevices(); len(got) != 1 || got[0].GetName() != qualified || len(cresp.GetEnvs()) != 0 {
				t.Fatalf("Allocate = %v, want only CDI device %s", cresp, qualified)
			}
			f.podRes.hold("default", "train", "main", tt.ids...)
			if err := f.preStart(tt.ids...); err != nil {
				t.Fatal(err)
			}

			want := &cdispecs.Spec{Version: tt.wantVersion, Kind: handoff.CDIKind, Devices: []cdispecs.Device{{
				Name:           name,
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

// TestHolderNamesWhenDevicesMove: device IDs pass from pod to pod, and
// each holder gets a CDI device name of its own at Allocate. A runtime
// that resolves names from a cache refreshed on notification (containerd)
// and has not yet seen the new holder's spec must find nothing under the
// new name, never the previous holder's edits; once refreshed it finds the
// new holder's. A restart of the container keeps its name. The IDs keep
// one spec file, which defines the current holder's device only, so the
// folder does not grow with every holder, and collection keeps it.
func TestHolderNamesWhenDevicesMove(t *testing.T) {
	f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
	ids := []string{DeviceID(gpuA, 2)}
	runtime, err := cdi.NewCache(cdi.WithSpecDirs(f.cfg.CDISpecDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
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
	var names []string
	prev := ""
	for _, s := range steps {
		if prev != "" {
			f.deletePod("default", prev)
			f.podRes.forget("default", prev)
		}
		prev = s.pod
		f.addPod(gpuPod(s.pod, time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, s.memory, 10)), "main"))
		cresp, err := f.allocate(ids...)
		if err != nil {
			t.Fatalf("pod %s: Allocate: %v", s.pod, err)
		}
		qualified := cresp.GetCdiDevices()[0].GetName()
		name := strings.TrimPrefix(qualified, handoff.CDIKind+"=")
		if !handoff.IsHolderName(name, handoff.DeviceName(ids)) || slices.Contains(names, name) {
			t.Fatalf("pod %s: Allocate gave CDI device %q; want a holder name of %s not given before (%v)", s.pod, name, handoff.DeviceName(ids), names)
		}
		names = append(names, name)
		f.podRes.hold("default", s.pod, "main", ids...)
		for start := range 2 { // the first start and a restart
			if err := f.preStart(ids...); err != nil {
				t.Fatalf("pod %s: start %d: %v", s.pod, start, err)
			}
			if start == 0 {
				if _, err := injectInto(runtime.InjectDevices, qualified); err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices") {
					t.Errorf("pod %s: a runtime cache not refreshed since the spec was written resolved %s: %v; want unresolvable", s.pod, qualified, err)
				}
			}
			if err := runtime.Refresh(); err != nil {
				t.Fatal(err)
			}
			got, err := injectInto(runtime.InjectDevices, qualified)
			if err != nil {
				t.Fatalf("pod %s: start %d: %v", s.pod, start, err)
			}
			env := []string{envValue(got.Process.Env, handoff.EnvPod), envValue(got.Process.Env, handoff.EnvPodUID), envValue(got.Process.Env, handoff.EnvMemoryLimitPrefix+"0")}
			if diff := cmp.Diff([]string{s.wantPod, s.wantUID, s.wantHeld}, env); diff != "" {
				t.Errorf("pod %s: start %d: pod, UID, memory limit (-want +got):\n%s", s.pod, start, diff)
			}
		}
	}
	wantFiles := []string{handoff.SpecFileName(handoff.DeviceName(ids))}
	for _, when := range []string{"", " after collection"} {
		if when != "" {
			f.alloc.t.ClaimTTL = 0
			f.alloc.gc(context.Background())
		}
		if diff := cmp.Diff(wantFiles, readDirNames(t, f.cfg.CDISpecDir)); diff != "" {
			t.Errorf("spec folder%s: one file for the IDs, no temporary files (-want +got):\n%s", when, diff)
		}
		if spec := f.readSpec(ids...); len(spec.Devices) != 1 || spec.Devices[0].Name != names[1] {
			t.Errorf("the IDs' spec file%s defines %+v; want the current holder's device %s only", when, spec.Devices, names[1])
		}
	}
}

// TestHolderFileOfTheReleaseBefore: the release before wrote each holder's
// spec into a file of the holder's own. A container it allocated keeps
// that file (a second file defining the same device would make the
// runtime refuse both), and collection keeps it while the container holds
// the devices, and removes the file of a holder that no longer does.
func TestHolderFileOfTheReleaseBefore(t *testing.T) {
	f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
	ids := []string{DeviceID(gpuA, 1)}
	f.addPod(gpuPod("p", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0)), "main"))
	cresp, err := f.allocate(ids...)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(cresp.GetCdiDevices()[0].GetName(), handoff.CDIKind+"=")
	gone := handoff.HolderName(handoff.DeviceName([]string{DeviceID(gpuB, 2)}), "0123456789ab")
	for _, n := range []string{name, gone} {
		old, err := handoff.BuildSpec(n, handoff.Edits{Env: []handoff.EnvVar{{Name: handoff.EnvPod, Value: "default/written-before"}}})
		if err == nil {
			err = handoff.WriteSpec(f.cfg.CDISpecDir, old)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	f.podRes.hold("default", "p", "main", ids...)
	if err := f.preStart(ids...); err != nil {
		t.Fatal(err)
	}
	want := []string{handoff.SpecFileName(name), handoff.SpecFileName(gone)}
	slices.Sort(want)
	if diff := cmp.Diff(want, readDirNames(t, f.cfg.CDISpecDir)); diff != "" {
		t.Errorf("spec folder: the holder's own file rewritten, no file for the IDs (-want +got):\n%s", diff)
	}
	if got := envValue(f.inject(handoff.CDIQualifiedName(name)).Process.Env, handoff.EnvPod); got != "default/p" {
		t.Errorf("%s resolves to pod %q, want default/p", name, got)
	}
	f.alloc.t.ClaimTTL = 0
	f.alloc.gc(context.Background())
	if diff := cmp.Diff([]string{handoff.SpecFileName(name)}, readDirNames(t, f.cfg.CDISpecDir)); diff != "" {
		t.Errorf("spec folder after collection (-want +got):\n%s", diff)
	}
}

// TestHoldingSurvivesRestart: the name Allocate gave is checkpointed, so
// a plugin restarted before the container's start writes the spec under
// it; devices that no Allocate of this release named (a container
// allocated before holder names) keep the IDs' own name. A checkpoint
// whose holding does not match its IDs is refused with the field named.
func TestHoldingSurvivesRestart(t *testing.T) {
	f := newHandoff(t, nil)
	ids, legacy := []string{DeviceID(gpuA, 1)}, []string{DeviceID(gpuB, 3)}
	f.addPod(gpuPod("p", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0)), "main"))
	f.addPod(gpuPod("old", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 1024, 0)), "main"))
	cresp, err := f.allocate(ids...)
	if err != nil {
		t.Fatal(err)
	}
	// The checkpoint is written in the background, soon after Allocate.
	path := filepath.Join(f.cfg.EffectiveStateDir(), checkpointFileName)
	name := strings.TrimPrefix(cresp.GetCdiDevices()[0].GetName(), handoff.CDIKind+"=")
	f.waitView("the checkpoint to hold "+name, func() bool {
		data, err := os.ReadFile(path)
		return err == nil && strings.Contains(string(data), name)
	})
	if f.alloc.claims, err = loadClaimStore(path); err != nil {
		t.Fatal(err)
	}
	f.podRes.hold("default", "p", "main", ids...)
	f.podRes.hold("default", "old", "main", legacy...)
	for _, d := range [][]string{ids, legacy} {
		if err := f.preStart(d...); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		handoff.SpecFileName(handoff.DeviceName(ids)),
		handoff.SpecFileName(handoff.DeviceName(legacy)),
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, readDirNames(t, f.cfg.CDISpecDir)); diff != "" {
		t.Errorf("spec folder after a restart between Allocate and the starts (-want +got):\n%s", diff)
	}

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(data), handoff.DeviceName(ids)+"-", handoff.DeviceName(legacy)+"-", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil { //nolint:gosec // G703: the test's own temporary folder.
		t.Fatal(err)
	}
	if s, err := loadClaimStore(path); err == nil || !strings.Contains(err.Error(), "holdings[0]") || len(s.holdings) != 0 {
		t.Errorf("loadClaimStore of a holding that does not match its IDs = %d holdings, %v; want none and an error naming holdings[0]", len(s.holdings), err)
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

// TestStartRecoversANameLostAtAllocate: a plugin killed right after
// Allocate answered, before its checkpoint was written in the background
// (held back here by the store's file lock, as such a kill leaves it),
// loses the CDI device name it gave; the kubelet keeps the answer, and
// every start of the container asks the runtime for that name. The
// restarted plugin, whose own record has no name for the IDs or the name
// of their previous holder, takes the name from the kubelet's device
// checkpoint, which gives the IDs and that answer to the container the
// start confirms, writes the spec under it and records it.
func TestStartRecoversANameLostAtAllocate(t *testing.T) {
	for _, previous := range []bool{false, true} {
		t.Run(map[bool]string{false: "no record", true: "the previous holder's record"}[previous], func(t *testing.T) {
			fake := func(c *Config) { c.FakeGPUs = "2xA100-80GB" } // no device nodes
			killed := newHandoff(t, fake)
			shared := func(c *Config) {
				fake(c)
				c.DevicePluginDir, c.CDISpecDir, c.StateDir = killed.cfg.DevicePluginDir, killed.cfg.CDISpecDir, killed.cfg.StateDir
			}
			pod := gpuPod("p", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0)), "main")
			killed.addPod(pod)
			lowest := []string{DeviceID(gpuA, 0)} // what the offer picks
			if previous {
				killed.alloc.claims.hold(lowest, time.Now().Add(-time.Hour), nil)
				if err := killed.alloc.claims.flush(); err != nil {
					t.Fatal(err)
				}
			}
			killed.alloc.claims.fileMu.Lock()
			t.Cleanup(killed.alloc.claims.fileMu.Unlock) // before the fixture drains
			ids, name := killed.admitOne(1)
			if !slices.Equal(ids, lowest) {
				t.Fatalf("offered %v, want %v", ids, lowest)
			}

			restarted := newHandoff(t, shared)
			path := filepath.Join(restarted.cfg.EffectiveStateDir(), checkpointFileName)
			var err error
			if restarted.alloc.claims, err = loadClaimStore(path); err != nil {
				t.Fatal(err)
			}
			if held, ok := restarted.alloc.claims.held(handoff.DeviceName(ids)); ok == !previous || held == name {
				t.Fatalf("the restarted plugin's record of %v = %q, %v; want the previous holder's name or none", ids, held, ok)
			}
			restarted.addPod(pod)
			restarted.podRes.hold("default", "p", "main", ids...)
			qualified := handoff.CDIQualifiedName(name)
			restarted.kubeletCheckpointAnswer("uid-p", "main", &pluginapi.ContainerAllocateResponse{CdiDevices: []*pluginapi.CDIDevice{{Name: qualified}}}, ids...)
			if err := restarted.preStart(ids...); err != nil {
				t.Fatalf("start after the plugin was killed at Allocate: %v", err)
			}
			got := restarted.inject(qualified)
			env := []string{envValue(got.Process.Env, handoff.EnvPod), envValue(got.Process.Env, handoff.EnvPodUID), envValue(got.Process.Env, handoff.EnvMemoryLimitPrefix+"0")}
			if diff := cmp.Diff([]string{"default/p", "uid-p", "1024m"}, env); diff != "" {
				t.Errorf("%s resolved by the runtime: pod, UID, memory limit (-want +got):\n%s", qualified, diff)
			}
			reloaded, err := loadClaimStore(path)
			if err != nil {
				t.Fatal(err)
			}
			if held, _ := reloaded.held(handoff.DeviceName(ids)); held != name {
				t.Errorf("checkpoint after the start names %q for %v, want %q", held, ids, name)
			}
		})
	}
}

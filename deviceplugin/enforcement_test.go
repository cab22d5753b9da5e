package deviceplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestChooseEnforcement(t *testing.T) {
	hook := handoff.DriverHook{Found: true}
	noHook := handoff.DriverHook{Missing: "no NVIDIA container toolkit CDI spec found"}
	driver := handoff.NodeFacts{DriverVersion: "615.20.01", CgroupVersion: 2, DriverHook: hook}
	mps := handoff.NodeFacts{DriverVersion: "550.54.15", CgroupVersion: 1, MPSControl: "/usr/bin/nvidia-cuda-mps-control"}
	all := handoff.NodeFacts{DriverVersion: "620.1", CgroupVersion: 2, MPSControl: "/usr/bin/nvidia-cuda-mps-control", DriverHook: hook}
	unhooked := handoff.NodeFacts{DriverVersion: "615.20.01", CgroupVersion: 2, DriverHook: noHook}
	lib := func(c *Config) { c.HostLibVGPU = "/opt/hami/libvgpu.so" }
	assume := func(c *Config) { c.EnforcementDriverHook = handoff.DriverHookAssume }
	tests := []struct {
		name          string
		mutate        func(*Config)
		facts         handoff.NodeFacts
		wantQualified []vgpu.Enforcement
		want          vgpu.Enforcement
		wantForcedOK  bool
		wantErr       error
	}{
		{name: "nothing", want: vgpu.EnforcementNone, wantQualified: []vgpu.Enforcement{vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "R615 on cgroup v2", facts: driver, want: vgpu.EnforcementDriver,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementDriver, vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "R615 on cgroup v2 without the memory-limit hook does not qualify", facts: unhooked, want: vgpu.EnforcementNone,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "without the hook the next mechanism is taken", mutate: lib, facts: unhooked, want: vgpu.EnforcementHAMiCore,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementHAMiCore, vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "the hook assumed", mutate: assume, facts: unhooked, want: vgpu.EnforcementDriver,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementDriver, vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "an assumed hook needs the driver too", mutate: assume, facts: handoff.NodeFacts{DriverVersion: "580.95.05", CgroupVersion: 2}, want: vgpu.EnforcementNone,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "R615 on cgroup v1 does not qualify", facts: handoff.NodeFacts{DriverVersion: "615.20", CgroupVersion: 1}, want: vgpu.EnforcementNone,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "an older driver on cgroup v2 does not qualify", facts: handoff.NodeFacts{DriverVersion: "580.95.05", CgroupVersion: 2}, want: vgpu.EnforcementNone,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "libvgpu configured", mutate: lib, want: vgpu.EnforcementHAMiCore,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementHAMiCore, vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "MPS found", facts: mps, want: vgpu.EnforcementMPS,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementMPS, vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "the strongest wins", mutate: lib, facts: all, want: vgpu.EnforcementDriver,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementDriver, vgpu.EnforcementHAMiCore, vgpu.EnforcementMPS, vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "disabled mechanisms are skipped", mutate: func(c *Config) { lib(c); c.DisabledEnforcement = []string{"driver", "hami-core"} }, facts: all,
			want:          vgpu.EnforcementMPS,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementDriver, vgpu.EnforcementHAMiCore, vgpu.EnforcementMPS, vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "forced none", mutate: func(c *Config) { c.Enforcement = "none" }, facts: all, want: vgpu.EnforcementNone,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementDriver, vgpu.EnforcementMPS, vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "forced driver on a node whose driver does not qualify", mutate: func(c *Config) { c.Enforcement = "driver" }, facts: handoff.NodeFacts{DriverVersion: "550.54.15", MPSControl: "/usr/bin/nvidia-cuda-mps-control", DriverHook: hook}, want: vgpu.EnforcementDriver,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementMPS, vgpu.EnforcementNone}},
		{name: "forced driver without the hook", mutate: func(c *Config) { c.Enforcement = "driver" }, facts: unhooked, wantErr: handoff.ErrDriverHookMissing,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementNone}},
		{name: "forced driver with the hook assumed", mutate: func(c *Config) { c.Enforcement = "driver"; assume(c) }, facts: unhooked, want: vgpu.EnforcementDriver,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementDriver, vgpu.EnforcementNone}, wantForcedOK: true},
		{name: "forced mps without the binary", mutate: func(c *Config) { c.Enforcement = "mps" }, facts: driver, wantErr: handoff.ErrMPSUnavailable,
			wantQualified: []vgpu.Enforcement{vgpu.EnforcementDriver, vgpu.EnforcementNone}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig()
			if tt.mutate != nil {
				tt.mutate(&cfg)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantQualified, handoff.QualifiedEnforcements(cfg.EnforcementConfig(), tt.facts)); diff != "" {
				t.Errorf("QualifiedEnforcements (-want +got):\n%s", diff)
			}
			got, qualified, err := handoff.ChooseEnforcement(cfg.EnforcementConfig(), tt.facts)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("handoff.ChooseEnforcement() error = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want || qualified != tt.wantForcedOK {
				t.Errorf("handoff.ChooseEnforcement() = %q, qualified %v; want %q, %v", got, qualified, tt.want, tt.wantForcedOK)
			}
		})
	}
}

func TestCgroupVersion(t *testing.T) {
	v2 := t.TempDir()
	if err := os.WriteFile(filepath.Join(v2, "cgroup.controllers"), []byte("cpu memory\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for root, want := range map[string]int{v2: 2, t.TempDir(): 1, filepath.Join(t.TempDir(), "missing"): 0} {
		if got := handoff.CgroupVersion(root); got != want {
			t.Errorf("CgroupVersion(%s) = %d, want %d", root, got, want)
		}
	}
	bin := writeScript(t, "nvidia-cuda-mps-control", "exit 0")
	f := handoff.DetectNodeFacts("615.1", v2, bin)
	if diff := cmp.Diff(handoff.NodeFacts{DriverVersion: "615.1", CgroupVersion: 2, MPSControl: bin}, f); diff != "" {
		t.Errorf("DetectNodeFacts (-want +got):\n%s", diff)
	}
	if f := handoff.DetectNodeFacts("", v2, filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")); f.MPSControl != "" {
		t.Errorf("DetectNodeFacts found MPS at %q, want none", f.MPSControl)
	}
}

// nvidiaSpec is an NVIDIA container toolkit CDI spec with GPUs 0 to 2,
// named by index (nvidia-ctk's default), and the memory-limit hook.
var nvidiaSpec = filepath.Join("testdata", "nvidia-toolkit.yaml")

// TestEnforcementBackends runs Allocate and PreStartContainer on a node
// with each mechanism, in both modes, and checks what the container gets:
// the CDI devices of Allocate, and the environment and mounts the CDI
// library injects from the specs (mode cdi) or Allocate returns (mode env).
func TestEnforcementBackends(t *testing.T) {
	cdiDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(cdiDir, "nvidia.yaml"), readFile(t, nvidiaSpec), 0o600); err != nil {
		t.Fatal(err)
	}
	driver := handoff.NodeFacts{DriverVersion: "615.20", CgroupVersion: 2}
	mps := handoff.NodeFacts{MPSControl: "/usr/bin/nvidia-cuda-mps-control"}
	tests := []struct {
		name   string
		mutate func(*Config)
		facts  handoff.NodeFacts
		slice  *vgputest.AllocationBuilder
		// wantEnv are the variables of the mechanism (others are checked
		// by the CDI and env tests); wantNot must be absent.
		wantEnv     map[string]string
		wantNot     []string
		wantDevices []string // beside the plugin's own (mode cdi)
		wantMounts  []string // container paths
		wantEvent   string
	}{{
		name: "driver", facts: driver, slice: vgputest.Allocation("node-1").Container("main").Slice(gpuB, 10240, 30),
		wantEnv:     map[string]string{handoff.EnvGPUMemoryRequest: "10240", handoff.EnvGPUMemoryLimit: "10240", "NVIDIA_TOOLKIT_GPU": "1"},
		wantNot:     []string{handoff.EnvMPSPipeDirectory},
		wantDevices: []string{"nvidia.com/gpu=1"},
		wantEvent:   "Normal GPUEnforcement container main: enforcement driver: the NVIDIA driver limits GPU memory to 10240 MiB per GPU",
	}, {
		name: "driver: one limit, the smallest slice, for two GPUs", facts: driver,
		slice:       vgputest.Allocation("node-1").Container("main").Slice(gpuA, 8192, 0).Slice(gpuB, 4096, 0),
		wantEnv:     map[string]string{handoff.EnvGPUMemoryRequest: "4096", handoff.EnvGPUMemoryLimit: "4096"},
		wantDevices: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"},
		wantEvent:   "Normal GPUEnforcement container main: enforcement driver: the NVIDIA driver limits GPU memory to 4096 MiB per GPU",
	}, {
		name: "hami-core", mutate: func(c *Config) { c.HostLibVGPU = "/opt/hami/libvgpu.so" },
		slice:      vgputest.Allocation("node-1").Container("main").Slice(gpuA, 2048, 25),
		wantEnv:    map[string]string{handoff.EnvMemoryLimitPrefix + "0": "2048m", handoff.EnvSMLimit: "25"},
		wantNot:    []string{handoff.EnvGPUMemoryLimit, handoff.EnvMPSPipeDirectory},
		wantMounts: []string{handoff.PreloadContainerPath, handoff.LibVGPUContainerPath},
		wantEvent:  "Normal GPUEnforcement container main: enforcement hami-core: libvgpu.so limits GPU memory to 2048 MiB per GPU and compute to 25%",
	}, {
		name: "mps", facts: mps, slice: vgputest.Allocation("node-1").Container("main").Slice(gpuB, 6144, 40),
		wantEnv: map[string]string{
			handoff.EnvMPSPipeDirectory: "MPS/gpu1/pipe", handoff.EnvMPSPinnedMemoryLimit: "0=6144M", handoff.EnvMPSActiveThreadPercentage: "40",
		},
		wantNot:    []string{handoff.EnvGPUMemoryLimit},
		wantMounts: []string{"MPS/gpu1/pipe", handoff.MPSShmContainerPath},
		wantEvent:  "Normal GPUEnforcement container main: enforcement mps: the MPS control daemon of GPU " + gpuB + " limits device memory to 6144 MiB and active threads to 40%",
	}, {
		name: "mps does not guard two GPUs", facts: mps,
		slice:     vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0).Slice(gpuB, 1024, 0),
		wantNot:   []string{handoff.EnvMPSPipeDirectory, handoff.EnvMPSPinnedMemoryLimit},
		wantEvent: "Normal GPUEnforcement container main: enforcement none: node node-1 uses MPS, which serves containers on one GPU; this one has 2",
	}, {
		name: "none", slice: vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 10),
		wantEnv:   map[string]string{handoff.EnvMemoryLimitPrefix + "0": "1024m"},
		wantNot:   []string{handoff.EnvGPUMemoryLimit, handoff.EnvMPSPipeDirectory},
		wantEvent: "Normal GPUEnforcement container main: enforcement none: node node-1 has no enforcement mechanism",
	}}
	for _, mode := range []Mode{ModeCDI, ModeEnv} {
		for _, tt := range tests {
			t.Run(string(mode)+"/"+tt.name, func(t *testing.T) {
				f := newHandoff(t, func(c *Config) {
					c.Mode = mode
					c.FakeGPUs = "2xA100-80GB"
					c.NVIDIACDISpecs = []string{filepath.Join(cdiDir, "nvidia*.yaml")}
					if tt.mutate != nil {
						tt.mutate(c)
					}
				})
				f.useFacts(tt.facts)
				alloc := tt.slice.Obj()
				var ids []string
				for _, s := range alloc.Containers[0].GPUs {
					ids = append(ids, DeviceID(s.UUID, 2))
				}
				f.addPod(gpuPod("p", time.Now(), &alloc, "main"))
				cresp, err := f.allocate(ids...)
				if err != nil {
					t.Fatal(err)
				}
				var devices []string
				for _, d := range cresp.GetCdiDevices() {
					devices = append(devices, d.GetName())
				}
				own := handoff.CDIQualifiedName(f.alloc.cdiDeviceOf(ids))
				wantDevices := tt.wantDevices
				if mode == ModeCDI {
					wantDevices = append([]string{own}, wantDevices...)
				}
				if diff := cmp.Diff(wantDevices, devices); diff != "" {
					t.Errorf("Allocate CDI devices (-want +got):\n%s", diff)
				}
				f.podRes.hold("default", "p", "main", ids...)
				if err := f.preStart(ids...); err != nil {
					t.Fatal(err)
				}

				env, mounts := map[string]string{}, map[string]bool{}
				for k, v := range cresp.GetEnvs() {
					env[k] = v
				}
				for _, m := range cresp.GetMounts() {
					mounts[m.GetContainerPath()] = true
					if m.GetReadOnly() == (strings.HasPrefix(m.GetContainerPath(), f.cfg.MPSDir) || m.GetContainerPath() == handoff.MPSShmContainerPath) {
						t.Errorf("mount %s read-only %v, want only the MPS pipe folder writable", m.GetContainerPath(), m.GetReadOnly())
					}
				}
				if len(devices) > 0 {
					// The runtime resolves the CDI devices over the
					// environment Allocate returned (mode env).
					got := injectAll(t, []string{f.cfg.CDISpecDir, cdiDir}, devices...)
					for _, kv := range got.Process.Env {
						k, v, _ := strings.Cut(kv, "=")
						env[k] = v
					}
					for _, m := range got.Mounts {
						mounts[m.Destination] = true
					}
					hooked := slices.ContainsFunc(got.Hooks.CreateContainer, func(h ociHook) bool {
						return slices.Contains(h.Args, "apply-cuda-memory-limits")
					})
					if hooked != (len(tt.wantDevices) > 0) {
						t.Errorf("memory-limit hook injected: %v, want %v", hooked, len(tt.wantDevices) > 0)
					}
				}
				for k, v := range tt.wantEnv {
					v = strings.Replace(v, "MPS", f.cfg.MPSDir, 1)
					if env[k] != v {
						t.Errorf("env %s = %q, want %q", k, env[k], v)
					}
				}
				for _, k := range tt.wantNot {
					if _, ok := env[k]; ok {
						t.Errorf("env %s = %q, want it unset", k, env[k])
					}
				}
				var gotMounts, wantMounts []string
				for m := range mounts {
					gotMounts = append(gotMounts, m)
				}
				for _, m := range tt.wantMounts {
					wantMounts = append(wantMounts, strings.Replace(m, "MPS", f.cfg.MPSDir, 1))
				}
				if diff := cmp.Diff(sortedCopy(wantMounts), sortedCopy(gotMounts)); diff != "" {
					t.Errorf("mounts (-want +got):\n%s", diff)
				}
				if ev := f.event(); !strings.HasPrefix(ev, tt.wantEvent) {
					t.Errorf("event %q, want one starting with %q", ev, tt.wantEvent)
				}
			})
		}
	}
}

// injectAll resolves devices from the specs in dirs with the CDI library,
// as a container runtime does, into an empty OCI spec.
func injectAll(t *testing.T, dirs []string, devices ...string) ociResult {
	t.Helper()
	c, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache: %v (errors %v)", err, c.GetErrors())
	}
	got, err := injectInto(c.InjectDevices, devices...)
	if err != nil {
		t.Fatalf("CDI inject %v: %v (spec errors %v)", devices, err, c.GetErrors())
	}
	return got
}

// TestDriverNeedsMemoryLimitHook: a node with the driver and cgroup for
// driver qualifies for it only when the NVIDIA toolkit's CDI specs run the
// memory-limit hook for every GPU, or when the operator says to assume it
// (then driver is unverified, and the enforcement events say so);
// otherwise the next mechanism is taken and the log and Node event say why.
func TestDriverNeedsMemoryLimitHook(t *testing.T) {
	spec := string(readFile(t, nvidiaSpec))
	hookless := spec[:strings.Index(spec, "containerEdits:\n  hooks:")]
	byUUID := strings.NewReplacer(`name: "0"`, `name: "`+gpuA+`"`).Replace(spec)
	deviceHook := hookless
	for _, i := range []string{"0", "1"} {
		deviceHook = strings.Replace(deviceHook, `env: ["NVIDIA_TOOLKIT_GPU=`+i+`"]`,
			`{env: ["NVIDIA_TOOLKIT_GPU=`+i+`"], hooks: [{hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, apply-cuda-memory-limits, --gpu-id=`+i+`]}]}`, 1)
	}
	oneGPU := strings.Replace(spec, `name: "1"`, `name: "9"`, 1)
	driver := handoff.NodeFacts{DriverVersion: "615.20", CgroupVersion: 2}
	tests := []struct {
		name       string
		specs      map[string]string // file name: content
		mutate     func(*Config)
		want       vgpu.Enforcement
		unverified bool
		// wantEvent starts the Node event's type and message.
		wantEvent string
		// wantPodEvent is in the event of a container start.
		wantPodEvent string
		wantDevices  map[string]string
	}{{
		name: "no toolkit spec", want: vgpu.EnforcementNone,
		wantEvent:    "Warning GPUEnforcement enforcement none; driver is not offered: no NVIDIA container toolkit CDI spec found",
		wantPodEvent: "enforcement none",
	}, {
		name: "a spec without the hook", specs: map[string]string{"nvidia.yaml": hookless}, want: vgpu.EnforcementNone,
		wantEvent:    "Warning GPUEnforcement enforcement none; driver is not offered: the NVIDIA container toolkit CDI specs do not run nvidia-cdi-hook apply-cuda-memory-limits for GPU " + gpuA + ", " + gpuB,
		wantPodEvent: "enforcement none",
	}, {
		name: "a spec without the hook: the next mechanism", specs: map[string]string{"nvidia.yaml": hookless},
		mutate: func(c *Config) { c.HostLibVGPU = "/opt/hami/libvgpu.so" }, want: vgpu.EnforcementHAMiCore,
		wantEvent:    "Warning GPUEnforcement enforcement hami-core; driver is not offered: the NVIDIA container toolkit CDI specs do not run",
		wantPodEvent: "enforcement hami-core",
	}, {
		name: "a spec that names one GPU of two", specs: map[string]string{"nvidia.yaml": oneGPU}, want: vgpu.EnforcementNone,
		wantEvent:    "Warning GPUEnforcement enforcement none; driver is not offered: the NVIDIA container toolkit CDI specs name no device for GPU " + gpuB,
		wantPodEvent: "enforcement none",
	}, {
		name: "the spec's hook", specs: map[string]string{"nvidia.yaml": spec}, want: vgpu.EnforcementDriver,
		wantEvent:    "Normal GPUEnforcement enforcement driver: the NVIDIA toolkit's CDI specs run nvidia-cdi-hook apply-cuda-memory-limits for every GPU",
		wantPodEvent: "enforcement driver: the NVIDIA driver limits GPU memory",
		wantDevices:  map[string]string{gpuA: "nvidia.com/gpu=0", gpuB: "nvidia.com/gpu=1"},
	}, {
		name: "the hook in each device", specs: map[string]string{"nvidia.yaml": deviceHook}, want: vgpu.EnforcementDriver,
		wantEvent:    "Normal GPUEnforcement enforcement driver",
		wantPodEvent: "enforcement driver: the NVIDIA driver limits GPU memory",
		wantDevices:  map[string]string{gpuA: "nvidia.com/gpu=0", gpuB: "nvidia.com/gpu=1"},
	}, {
		name: "devices by UUID; the first spec that names a GPU wins", specs: map[string]string{"nvidia-a.yaml": byUUID, "nvidia-b.yaml": oneGPU},
		want: vgpu.EnforcementDriver, wantEvent: "Normal GPUEnforcement enforcement driver",
		wantPodEvent: "enforcement driver: the NVIDIA driver limits GPU memory",
		wantDevices:  map[string]string{gpuA: "nvidia.com/gpu=" + gpuA, gpuB: "nvidia.com/gpu=1"},
	}, {
		name: "assumed", mutate: func(c *Config) { c.EnforcementDriverHook = handoff.DriverHookAssume }, want: vgpu.EnforcementDriver, unverified: true,
		wantEvent:    "Warning GPUEnforcement enforcement driver (unverified: no NVIDIA container toolkit CDI spec found",
		wantPodEvent: "enforcement driver, unverified:",
		wantDevices:  map[string]string{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.specs {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			f := newHandoff(t, func(c *Config) {
				c.FakeGPUs = "2xA100-80GB"
				c.NVIDIACDISpecs = []string{filepath.Join(dir, "nvidia*.yaml")}
				if tt.mutate != nil {
					tt.mutate(c)
				}
			})
			c, err := chooseEnforcement(ktesting.NewLogger(t, ktesting.DefaultConfig), f.cfg, driver, handoffGPUs())
			if err != nil {
				t.Fatal(err)
			}
			if c.mech != tt.want || c.unverified() != tt.unverified {
				t.Errorf("mechanism %s, unverified %v; want %s, %v (driver: %+v)", c.mech, c.unverified(), tt.want, tt.unverified, c.driver)
			}
			if diff := cmp.Diff(tt.wantDevices, c.nvidiaCDI()); diff != "" {
				t.Errorf("NVIDIA CDI devices (-want +got):\n%s", diff)
			}

			events := record.NewFakeRecorder(1)
			p := &Plugin{cfg: f.cfg, events: events}
			p.enforcementNodeEvent(c)
			if ev := <-events.Events; !strings.HasPrefix(ev, tt.wantEvent) {
				t.Errorf("Node event %q, want one starting with %q", ev, tt.wantEvent)
			}

			f.useFacts(driver)
			alloc := vgputest.Allocation("node-1").Container("main").Slice(gpuA, 4096, 0).Obj()
			f.addPod(gpuPod("p", time.Now(), &alloc, "main"))
			id := DeviceID(gpuA, 0)
			if _, err := f.allocate(id); err != nil {
				t.Fatal(err)
			}
			f.podRes.hold("default", "p", "main", id)
			if err := f.preStart(id); err != nil {
				t.Fatal(err)
			}
			if ev := f.event(); !strings.Contains(ev, tt.wantPodEvent) {
				t.Errorf("pod event %q, want one containing %q", ev, tt.wantPodEvent)
			}
		})
	}
}

// writeScript writes an executable shell script named name.
func writeScript(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o700); err != nil { //nolint:gosec // G306: an executable for the test.
		t.Fatal(err)
	}
	return p
}

// TestMPSDaemons runs the supervisor over a fake nvidia-cuda-mps-control
// that records its arguments and environment and exits on its first run:
// each GPU gets its own daemon, started in the foreground with its GPU,
// pipe and log folders, and started again after it exits.
func TestMPSDaemons(t *testing.T) {
	bin := writeScript(t, "nvidia-cuda-mps-control", `
echo "$* $CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> "$CUDA_MPS_LOG_DIRECTORY/starts"
[ "$(wc -l < "$CUDA_MPS_LOG_DIRECTORY/starts")" -ge 2 ] || exit 3
exec sleep 600`)
	dir := t.TempDir()
	m := &handoff.MPSDaemons{Binary: bin, Dir: dir, GPUs: handoffGPUs(), Clock: clock.RealClock{}, RestartInitial: 10 * time.Millisecond}
	_, tctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(tctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	for _, g := range handoffGPUs() {
		pipe, logs := handoff.MPSPipeDir(dir, g.Index), handoff.MPSLogDir(dir, g.Index)
		want := strings.Join([]string{"-f", g.UUID, pipe, logs}, " ")
		waitUntil(t, "two starts of the daemon of "+g.UUID, func() bool {
			data, _ := os.ReadFile(filepath.Join(logs, "starts"))
			return string(data) == want+"\n"+want+"\n"
		})
		if st, err := os.Stat(pipe); err != nil || !st.IsDir() {
			t.Errorf("pipe folder %s: %v", pipe, err)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the supervisor did not stop the daemons")
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

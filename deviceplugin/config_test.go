package deviceplugin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

func validConfig() Config {
	c := DefaultConfig()
	c.NodeName = "node-1"
	return c
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name      string
		mutate    func(*Config)
		wantField string
	}{
		{name: "defaults with a node name", mutate: func(*Config) {}},
		{name: "missing node name", mutate: func(c *Config) { c.NodeName = "" }, wantField: "nodeName"},
		{name: "node name with capitals", mutate: func(c *Config) { c.NodeName = "Node_1" }, wantField: "nodeName"},
		{name: "split count zero", mutate: func(c *Config) { c.SplitCount = 0 }, wantField: "splitCount"},
		{name: "split count too large", mutate: func(c *Config) { c.SplitCount = 101 }, wantField: "splitCount"},
		{name: "memory scaling zero", mutate: func(c *Config) { c.MemoryScaling = 0 }, wantField: "memoryScaling"},
		{name: "memory scaling oversubscribes", mutate: func(c *Config) { c.MemoryScaling = 1.5 }},
		{name: "memory scaling too large", mutate: func(c *Config) { c.MemoryScaling = 11 }, wantField: "memoryScaling"},
		{name: "negative reserve", mutate: func(c *Config) { c.ReservedMemoryMiB = -1 }, wantField: "reservedMemoryMiB"},
		{name: "resource without domain", mutate: func(c *Config) { c.ResourceName = "gpu" }, wantField: "resourceName"},
		{name: "resource in kubernetes.io", mutate: func(c *Config) { c.ResourceName = "kubernetes.io/gpu" }, wantField: "resourceName"},
		{name: "relative plugin dir", mutate: func(c *Config) { c.DevicePluginDir = "device-plugins" }, wantField: "devicePluginDir"},
		{name: "exclude by uuid and index", mutate: func(c *Config) { c.ExcludeGPUs = []string{"GPU-abc", "3"} }},
		{name: "exclude garbage", mutate: func(c *Config) { c.ExcludeGPUs = []string{"first"} }, wantField: "excludeGPUs"},
		{name: "renew not below duration", mutate: func(c *Config) { c.LeaseRenew = c.LeaseDuration }, wantField: "leaseRenew"},
		{name: "bad namespace", mutate: func(c *Config) { c.HeartbeatNamespace = "Kube" }, wantField: "heartbeatNamespace"},
		{name: "zero cool-down", mutate: func(c *Config) { c.HealthCoolDown.Duration = 0 }, wantField: "healthCoolDown"},
		{name: "env mode", mutate: func(c *Config) { c.Mode = ModeEnv }},
		{name: "fake GPU faults folder", mutate: func(c *Config) { c.FakeGPUs = "1xT4-16GB"; c.FakeGPUFaultsDir = "/run/faults" }},
		{name: "faults folder without fake GPUs", mutate: func(c *Config) { c.FakeGPUFaultsDir = "/run/faults" }, wantField: "fakeGPUFaultsDir"},
		{name: "relative faults folder", mutate: func(c *Config) { c.FakeGPUs = "1xT4-16GB"; c.FakeGPUFaultsDir = "faults" }, wantField: "fakeGPUFaultsDir"},
		{name: "unknown mode", mutate: func(c *Config) { c.Mode = "docker" }, wantField: "mode"},
		{name: "empty mode", mutate: func(c *Config) { c.Mode = "" }, wantField: "mode"},
		{name: "relative CDI spec dir", mutate: func(c *Config) { c.CDISpecDir = "cdi" }, wantField: "cdiSpecDir"},
		{name: "unclean CDI spec dir", mutate: func(c *Config) { c.CDISpecDir = "/var/run/cdi/" }, wantField: "cdiSpecDir"},
		{name: "empty PodResources socket", mutate: func(c *Config) { c.PodResourcesSocket = "" }, wantField: "podResourcesSocket"},
		{name: "libvgpu set", mutate: func(c *Config) { c.HostLibVGPU = "/usr/local/vgpu/libvgpu.so" }},
		{name: "relative libvgpu", mutate: func(c *Config) { c.HostLibVGPU = "libvgpu.so" }, wantField: "hostLibVGPU"},
		{name: "unknown enforcement", mutate: func(c *Config) { c.Enforcement = "cgroup" }, wantField: "enforcement"},
		{name: "hami-core without libvgpu", mutate: func(c *Config) { c.Enforcement = "hami-core" }, wantField: "enforcement"},
		{name: "hami-core with libvgpu", mutate: func(c *Config) { c.Enforcement = "hami-core"; c.HostLibVGPU = "/opt/libvgpu.so" }},
		{name: "mps without a binary", mutate: func(c *Config) { c.Enforcement = "mps"; c.MPSControl = "" }, wantField: "enforcement"},
		{name: "forced none", mutate: func(c *Config) { c.Enforcement = "none" }},
		{name: "disabling none", mutate: func(c *Config) { c.DisabledEnforcement = []string{"none"} }, wantField: "disabledEnforcement"},
		{name: "disabling mps", mutate: func(c *Config) { c.DisabledEnforcement = []string{"mps"} }},
		{name: "relative NVIDIA CDI spec", mutate: func(c *Config) { c.NVIDIACDISpecs = []string{"cdi/nvidia.yaml"} }, wantField: "nvidiaCDISpecs"},
		{name: "bad NVIDIA CDI pattern", mutate: func(c *Config) { c.NVIDIACDISpecs = []string{"/etc/cdi/[nvidia"} }, wantField: "nvidiaCDISpecs"},
		{name: "relative MPS dir", mutate: func(c *Config) { c.MPSDir = "mps" }, wantField: "mpsDir"},
		{name: "relative shared cache dir", mutate: func(c *Config) { c.SharedCacheDir = "tmp" }, wantField: "sharedCacheDir"},
		{name: "state dir set", mutate: func(c *Config) { c.StateDir = "/var/lib/gpuslice" }},
		{name: "relative state dir", mutate: func(c *Config) { c.StateDir = "state" }, wantField: "stateDir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			err := c.Validate()
			var fe *vgpu.FieldError
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.As(err, &fe) {
				t.Fatalf("Validate() = %v, want a *vgpu.FieldError for %s", err, tt.wantField)
			}
			if diff := cmp.Diff(tt.wantField, fe.Field); diff != "" {
				t.Errorf("field (-want +got):\n%s", diff)
			}
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, tt.wantField) {
				t.Errorf("message %q must be one line naming %s", msg, tt.wantField)
			}
		})
	}
}

func TestLoadConfigFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("splitCount: 4\nmemoryScaling: 1.5\nexcludeGPUs: [\"1\"]\nleaseRenew: 2s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := validConfig()
	got, err := LoadConfigFile(good, base)
	if err != nil {
		t.Fatal(err)
	}
	want := base
	want.SplitCount, want.MemoryScaling, want.ExcludeGPUs, want.LeaseRenew = 4, 1.5, []string{"1"}, metav1.Duration{Duration: 2 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("LoadConfigFile (-want +got):\n%s", diff)
	}

	modes := filepath.Join(dir, "modes.yaml")
	if err := os.WriteFile(modes, []byte("mode: env\ncdiSpecDir: /etc/cdi\nhostLibVGPU: /opt/libvgpu.so\nstateDir: /var/lib/gpuslice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = LoadConfigFile(modes, base)
	if err != nil {
		t.Fatal(err)
	}
	want = base
	want.Mode, want.CDISpecDir, want.HostLibVGPU, want.StateDir = ModeEnv, "/etc/cdi", "/opt/libvgpu.so", "/var/lib/gpuslice"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("LoadConfigFile with hand-off fields (-want +got):\n%s", diff)
	}
	if got := want.EffectiveStateDir(); got != "/var/lib/gpuslice" {
		t.Errorf("EffectiveStateDir = %q with stateDir set", got)
	}
	if got := base.EffectiveStateDir(); got != filepath.Join(base.DevicePluginDir, "gpuslice-state") {
		t.Errorf("EffectiveStateDir = %q, want <devicePluginDir>/gpuslice-state", got)
	}

	unknown := filepath.Join(dir, "unknown.yaml")
	if err := os.WriteFile(unknown, []byte("splitCnt: 4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfigFile(unknown, base); err == nil || !strings.Contains(err.Error(), "splitCnt") {
		t.Errorf("LoadConfigFile(unknown field) = %v, want an error naming splitCnt", err)
	}
	if _, err := LoadConfigFile(filepath.Join(dir, "missing.yaml"), base); err == nil {
		t.Error("LoadConfigFile(missing file) = nil error")
	}
}

package deviceplugin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func envMode(c *Config) { c.Mode = ModeEnv }

// wantEnv is the env-mode answer for pod name's container main holding
// one slice of uuid.
func wantEnv(name, uuid string, memoryMiB string) map[string]string {
	return map[string]string{
		handoff.EnvVisibleDevices:          uuid,
		handoff.EnvMemoryLimitPrefix + "0": memoryMiB + "m",
		handoff.EnvSMLimit:                 "20",
		handoff.EnvSharedCache:             "/tmp/gpuslice/uid-" + name + "-main.cache",
		handoff.EnvPod:                     "default/" + name,
		handoff.EnvPodUID:                  "uid-" + name,
		handoff.EnvContainer:               "main",
		handoff.EnvAllocation:              `[{"uuid":"` + uuid + `","memoryMiB":` + memoryMiB + `,"coresPercent":20}]`,
	}
}

func TestEnvMode(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	podOn := func(name string, at time.Duration, uuid string, memoryMiB int64) func(*handoffFixture) {
		return func(f *handoffFixture) {
			f.addPod(gpuPod(name, t0.Add(at), allocOf(vgputest.Allocation("node-1").Container("main").Slice(uuid, memoryMiB, 20)), "main"))
		}
	}
	tests := []struct {
		name      string
		setup     []func(*handoffFixture)
		prefer    bool // GetPreferredAllocation runs before Allocate
		ids       []string
		holder    string // pod the kubelet gave the IDs to
		wantEnv   map[string]string
		wantErr   string // PreStart error; "": it succeeds
		wantEvent string
	}{
		{
			// Both pods want gpuB; without the offer Allocate would take the
			// older one, a. The kubelet is admitting b (PodResources lists
			// it, not a), so GetPreferredAllocation offers b's container.
			name: "offered, allocated and started for the same container",
			setup: []func(*handoffFixture){podOn("a", 0, gpuB, 3000), podOn("b", time.Second, gpuB, 6000),
				func(f *handoffFixture) { f.podRes.forget("default", "a") }},
			prefer: true,
			ids:    []string{DeviceID(gpuB, 0)}, holder: "b", wantEnv: wantEnv("b", gpuB, "6000"),
			wantEvent: "Normal " + handoff.ReasonEnforced + " container main: enforcement none: node node-1 has no enforcement mechanism",
		},
		{
			name:  "no offer: the pending container on those GPUs",
			setup: []func(*handoffFixture){podOn("a", 0, gpuB, 3000), podOn("c", time.Second, gpuA, 5000)},
			ids:   []string{DeviceID(gpuA, 7)}, holder: "c", wantEnv: wantEnv("c", gpuA, "5000"),
			wantEvent: "Normal " + handoff.ReasonEnforced + " container main:",
		},
		{
			name:  "allocated to one pod, started for another",
			setup: []func(*handoffFixture){podOn("a", 0, gpuB, 3000), podOn("b", time.Second, gpuB, 6000)},
			ids:   []string{DeviceID(gpuB, 0)}, holder: "b", wantEnv: wantEnv("a", gpuB, "3000"),
			wantErr:   "allocated to default/a/main but started for default/b/main",
			wantEvent: "Warning " + ReasonAllocationMismatch + " container main:",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newHandoff(t, envMode)
			for _, s := range tt.setup {
				s(f)
			}
			if tt.prefer {
				f.prefer(devicesOf(), nil, 1)
			}
			cresp, err := f.allocate(tt.ids...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantEnv, cresp.GetEnvs()); diff != "" {
				t.Errorf("Allocate env (-want +got):\n%s", diff)
			}
			if len(cresp.GetCdiDevices()) != 0 || len(cresp.GetMounts()) != 0 {
				t.Errorf("Allocate answered CDI devices %v and mounts %v, want none", cresp.GetCdiDevices(), cresp.GetMounts())
			}
			f.podRes.hold("default", tt.holder, "main", tt.ids...)
			err = f.preStart(tt.ids...)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("preStart = %v", err)
				}
			} else if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("preStart = %v, want FailedPrecondition containing %q", err, tt.wantErr)
			}
			if ev := f.event(); tt.wantEvent == "" && ev != "" || !strings.HasPrefix(ev, tt.wantEvent) {
				t.Errorf("event %q, want one starting with %q", ev, tt.wantEvent)
			}
		})
	}
}

func TestEnvModeRefusals(t *testing.T) {
	f := newHandoff(t, envMode)
	f.addPod(gpuPod("a", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 3000, 20)), "main"))
	if _, err := f.allocate(DeviceID(gpuA, 0)); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), gpuA) {
		t.Errorf("Allocate on a GPU no pending container wants = %v, want FailedPrecondition naming %s", err, gpuA)
	}
	// The kubelet holds devices this plugin never allocated (lost checkpoint).
	f.podRes.hold("default", "a", "main", DeviceID(gpuB, 1))
	err := f.preStart(DeviceID(gpuB, 1))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "not allocated by this plugin") {
		t.Errorf("preStart without a binding = %v, want FailedPrecondition", err)
	}
	if ev := f.event(); !strings.HasPrefix(ev, "Warning "+ReasonAllocationMismatch) {
		t.Errorf("event %q, want a %s warning", ev, ReasonAllocationMismatch)
	}
}

func TestEnvModeLibVGPUMounts(t *testing.T) {
	f := newHandoff(t, func(c *Config) { c.Mode = ModeEnv; c.HostLibVGPU = "/opt/hami/libvgpu.so" })
	f.addPod(gpuPod("a", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 3000, 20)), "main"))
	cresp, err := f.allocate(DeviceID(gpuB, 0))
	if err != nil {
		t.Fatal(err)
	}
	want := []*pluginapi.Mount{
		{ContainerPath: handoff.LibVGPUContainerPath, HostPath: "/opt/hami/libvgpu.so", ReadOnly: true},
		{ContainerPath: handoff.PreloadContainerPath, HostPath: filepath.Join(f.cfg.EffectiveStateDir(), handoff.PreloadFileName), ReadOnly: true},
	}
	var got, wantS []string
	for _, m := range cresp.GetMounts() {
		got = append(got, m.String())
	}
	for _, m := range want {
		wantS = append(wantS, m.String())
	}
	if diff := cmp.Diff(wantS, got); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
}

// TestCheckpointSurvivesRestart: a plugin restarted after an env-mode
// Allocate still verifies (and still refuses) container starts.
func TestCheckpointSurvivesRestart(t *testing.T) {
	f := newHandoff(t, envMode)
	f.addPod(gpuPod("a", time.Now().Add(-time.Minute), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 3000, 20)), "main"))
	f.addPod(gpuPod("b", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 3000, 20)), "main"))
	idA, idB := DeviceID(gpuB, 2), DeviceID(gpuA, 2)
	for _, id := range []string{idA, idB} {
		if _, err := f.allocate(id); err != nil {
			t.Fatal(err)
		}
	}

	path := filepath.Join(f.cfg.EffectiveStateDir(), checkpointFileName)
	restored, err := loadClaimStore(path)
	if err != nil {
		t.Fatal(err)
	}
	f.alloc.claims = restored
	f.podRes.hold("default", "a", "main", idA)
	if err := f.preStart(idA); err != nil {
		t.Errorf("restart of a's container after a plugin restart: %v", err)
	}
	f.podRes.hold("default", "c", "main", idB)
	if err := f.preStart(idB); err == nil || !strings.Contains(err.Error(), "allocated to default/b/main but started for default/c/main") {
		t.Errorf("mismatch after a plugin restart: %v", err)
	}

	if err := os.WriteFile(path, []byte("{broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := loadClaimStore(path); err == nil || !strings.Contains(err.Error(), path) || len(s.bindings) != 0 {
		t.Errorf("malformed checkpoint: %v, %d bindings; want an error naming the file and none", err, len(s.bindings))
	}
	if s, err := loadClaimStore(filepath.Join(t.TempDir(), "none.json")); err != nil || len(s.bindings) != 0 {
		t.Errorf("missing checkpoint: %v, %d bindings; want an empty store", err, len(s.bindings))
	}
}

// TestEnvModeRecreatedPodGetsItsOwnAllocation is a StatefulSet's web-0
// deleted and created again (UID uid-new, 2048 MiB on GPU B) while the
// plugin's view still shows the old pod (uid-old, 40960 MiB on GPU B):
// PodResources names the container by namespace and name only, and both
// slices are on the same GPU. Mode env answers Allocate with the
// environment itself, which the kubelet replays at every start, so
// Allocate confirms the pod with the API server and answers with the new
// pod's; each start confirms the binding's pod UID (the kubelet's device
// checkpoint, else the API server), as mode cdi confirms its pods.
func TestEnvModeRecreatedPodGetsItsOwnAllocation(t *testing.T) {
	oldWeb0 := func() *corev1.Pod {
		p := gpuPod("web-0", time.Now().Add(-time.Hour), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 40960, 0)), "main")
		p.UID = "uid-old"
		return p
	}
	id := DeviceID(gpuB, 0)

	t.Run("Allocate", func(t *testing.T) {
		f := newHandoff(t, envMode)
		f.addPod(oldWeb0())
		f.apiServerHas(recreatedWeb0())
		cresp, err := f.allocate(id)
		if err != nil {
			t.Fatalf("Allocate of web-0 created again while the view shows the old one: %v", err)
		}
		env := cresp.GetEnvs()
		if got := []string{env[handoff.EnvPodUID], env[handoff.EnvMemoryLimitPrefix+"0"]}; !slices.Equal(got, []string{"uid-new", "2048m"}) {
			t.Errorf("Allocate env pod UID and memory limit = %v, want the new pod's [uid-new 2048m]", got)
		}
		f.podRes.hold("default", "web-0", "main", id)
		f.apiServerDown()
		f.kubeletCheckpoint("uid-new", "main", id)
		if err := f.preStart(id); err != nil {
			t.Errorf("start confirmed by the kubelet's record while the view lags and the API server is down: %v", err)
		}
	})

	t.Run("PreStart", func(t *testing.T) {
		f := newHandoff(t, envMode)
		f.addPod(oldWeb0())
		// Allocate answered for the old pod (the API server had it then).
		if _, err := f.allocate(id); err != nil {
			t.Fatal(err)
		}
		f.podRes.hold("default", "web-0", "main", id)
		f.apiServerDown()
		if err := f.preStart(id); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cannot confirm with the API server") || !strings.Contains(err.Error(), "retried") {
			t.Errorf("start the kubelet's record does not confirm, with the API server down = %v; want FailedPrecondition: cannot confirm, retried", err)
		}
		f.event()
		f.apiServerHas(recreatedWeb0())
		err := f.preStart(id)
		const want = "allocated to default/web-0/main (pod UID uid-old) but started for default/web-0/main (pod UID uid-new)"
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), want) {
			t.Fatalf("start of the new web-0 with the old one's environment = %v; want FailedPrecondition containing %q", err, want)
		}
		if ev := f.event(); !strings.Contains(ev, "Warning "+ReasonAllocationMismatch) || !strings.Contains(ev, "uid-new") {
			t.Errorf("event = %q, want a Warning %s naming uid-new", ev, ReasonAllocationMismatch)
		}
		f.kubeletCheckpoint("uid-old", "main", id)
		if err := f.preStart(id); err != nil {
			t.Errorf("start the kubelet's record confirms for the binding's pod: %v", err)
		}
	})
}

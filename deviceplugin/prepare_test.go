package deviceplugin

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	testingclock "k8s.io/utils/clock/testing"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// admitOne offers and allocates devices for the pod the kubelet admits,
// as the kubelet does (GetPreferredAllocation, then Allocate with the
// offer), and returns the devices and the CDI device name Allocate gave.
func (f *handoffFixture) admitOne(size int32) (ids []string, name string) {
	f.t.Helper()
	ids = f.prefer(devicesOf(), nil, size)
	cresp, err := f.allocate(ids...)
	if err != nil {
		f.t.Fatalf("Allocate of the offered devices %v: %v", ids, err)
	}
	return ids, strings.TrimPrefix(cresp.GetCdiDevices()[0].GetName(), handoff.CDIKind+"=")
}

// specInode returns the inode of the spec file of ids: a rewrite (a new
// file renamed into place) changes it.
func (f *handoffFixture) specInode(ids []string) uint64 {
	f.t.Helper()
	info, err := os.Stat(filepath.Join(f.cfg.CDISpecDir, handoff.SpecFileName(handoff.DeviceName(ids))))
	if err != nil {
		f.t.Fatal(err)
	}
	return info.Sys().(*syscall.Stat_t).Ino
}

// TestAllocatePreparesTheSpec: Allocate of the devices offered to the only
// pending container writes that container's spec in the background, after
// the checkpoint names the container, so a runtime that refreshes its CDI
// cache before the container's creation resolves the device; the start
// leaves that spec alone (a rewrite would make a watching runtime read
// every spec again) and, after a restart, still knows it is the
// container's.
func TestAllocatePreparesTheSpec(t *testing.T) {
	f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
	f.addPod(gpuPod("p", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 2048, 0)), "main"))
	ids, name := f.admitOne(1)
	f.alloc.drain()
	if !handoff.SpecDefines(f.cfg.CDISpecDir, handoff.SpecFileName(handoff.DeviceName(ids)), name) {
		t.Fatalf("no spec for %s after Allocate's background write; folder has %v", name, readDirNames(t, f.cfg.CDISpecDir))
	}
	data, err := os.ReadFile(filepath.Join(f.cfg.EffectiveStateDir(), checkpointFileName))
	if err != nil || !strings.Contains(string(data), `"preparedFor"`) {
		t.Fatalf("checkpoint = %s, %v; want the holding's preparedFor", data, err)
	}
	runtime, err := cdi.NewCache(cdi.WithSpecDirs(f.cfg.CDISpecDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	got, err := injectInto(runtime.InjectDevices, handoff.CDIQualifiedName(name))
	if err != nil {
		t.Fatalf("a runtime cache read after Allocate: %v", err)
	}
	want := []string{"default/p", "uid-p", "2048m"}
	env := func(r ociResult) []string {
		return []string{envValue(r.Process.Env, handoff.EnvPod), envValue(r.Process.Env, handoff.EnvPodUID), envValue(r.Process.Env, handoff.EnvMemoryLimitPrefix+"0")}
	}
	if diff := cmp.Diff(want, env(got)); diff != "" {
		t.Errorf("prepared spec: pod, UID, memory limit (-want +got):\n%s", diff)
	}

	inode := f.specInode(ids)
	f.podRes.hold("default", "p", "main", ids...)
	if err := f.preStart(ids...); err != nil {
		t.Fatalf("start of the container the spec was prepared for: %v", err)
	}
	if f.specInode(ids) != inode {
		t.Error("the start rewrote the spec prepared for its container")
	}
	if f.alloc.claims, err = loadClaimStore(filepath.Join(f.cfg.EffectiveStateDir(), checkpointFileName)); err != nil {
		t.Fatal(err)
	}
	if err := f.preStart(ids...); err != nil {
		t.Fatalf("restart of the container after a plugin restart: %v", err)
	}
	if f.specInode(ids) != inode {
		t.Error("a start after a plugin restart rewrote the spec prepared for its container")
	}
	if diff := cmp.Diff(want, env(f.inject(handoff.CDIQualifiedName(name)))); diff != "" {
		t.Errorf("spec after the starts (-want +got):\n%s", diff)
	}
}

// TestAllocatePreparesOnlyForTheOnlyPendingContainer: with two pending
// containers listed, the offer is a choice between them, so the spec waits
// for the start, which knows which container holds the devices.
func TestAllocatePreparesOnlyForTheOnlyPendingContainer(t *testing.T) {
	f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
	now := time.Now()
	f.addPod(gpuPod("p", now, allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 2048, 0)), "main"))
	f.addPod(gpuPod("q", now.Add(time.Second), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 1024, 0)), "main"))
	ids, name := f.admitOne(1)
	f.alloc.drain()
	if names := readDirNames(t, f.cfg.CDISpecDir); len(names) != 0 {
		t.Fatalf("Allocate wrote a spec for %s although two containers were pending: %v", name, names)
	}
	f.podRes.hold("default", "p", "main", ids...)
	if err := f.preStart(ids...); err != nil {
		t.Fatal(err)
	}
	if got := envValue(specEnv(f.readSpec(ids...)), handoff.EnvPod); got != "default/p" {
		t.Errorf("spec written at the start names pod %q, want default/p", got)
	}
}

// TestPreparedSpecOfAnotherContainer: when the kubelet admitted another
// container than the one the devices were offered to (here: the pod it
// admits is not in the plugin's view yet, and an older listed pod is), a
// spec prepared and written for the offer's container is rewritten for
// the container that starts, and that start is refused: a runtime that
// caches specs may still serve the prepared edits under that name. Later
// starts are refused until the runtime has had SpecSettle to read the
// rewrite, then go ahead with the container's own slice. While the
// prepared spec is not written yet (the IDs' file still defines the
// previous holder's device), the starting container takes the name over
// and starts with its own slice at once.
func TestPreparedSpecOfAnotherContainer(t *testing.T) {
	for _, written := range []bool{true, false} {
		t.Run(map[bool]string{true: "written", false: "not yet written"}[written], func(t *testing.T) {
			f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
			clk := testingclock.NewFakeClock(time.Now())
			f.alloc.clock = clk
			f.addPod(gpuPod("x", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 2048, 0)), "main"))
			f.podRes.admit("default", "y")
			ids, name := f.admitOne(1)
			f.alloc.drain()
			key := handoff.DeviceName(ids)
			if !written {
				// The IDs' file still defines the previous holder's device.
				prev, err := handoff.BuildSpec(handoff.HolderName(key, "0123456789ab"), handoff.Edits{Env: []handoff.EnvVar{{Name: handoff.EnvPod, Value: "default/previous"}}})
				if err == nil {
					_, err = handoff.UpdateSpecFile(f.cfg.CDISpecDir, handoff.SpecFileName(key), prev)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			f.addViewPod(gpuPod("y", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 1024, 0)), "main"))
			f.podRes.hold("default", "y", "main", ids...)
			err := f.preStart(ids...)
			if written {
				wantSettling(t, f, err, "prepared at Allocate for container default/x/main")
				if got := envValue(specEnv(f.readSpec(ids...)), handoff.EnvPod); got != "default/y" {
					t.Errorf("after the refused start the spec names %q, want default/y", got)
				}
				wantSettling(t, f, f.preStart(ids...), "")
				clk.Step(f.alloc.t.SpecSettle)
				err = f.preStart(ids...)
			}
			if err != nil {
				t.Fatalf("start of y: %v", err)
			}
			if spec := f.readSpec(ids...); len(spec.Devices) != 1 || spec.Devices[0].Name != name || envValue(specEnv(spec), handoff.EnvPod) != "default/y" {
				t.Errorf("the IDs' spec file defines %+v; want %s for default/y", spec.Devices, name)
			}
			h, _ := f.alloc.claims.holding(handoff.DeviceName(ids))
			if h.For == nil || h.For.Ref.Pod != "y" {
				t.Errorf("holding prepared for %+v, want y's container", h.For)
			}
			data, err := os.ReadFile(filepath.Join(f.cfg.EffectiveStateDir(), checkpointFileName))
			if err != nil || !strings.Contains(string(data), `"uid-y"`) {
				t.Errorf("checkpoint = %s, %v; want y named before its spec was written", data, err)
			}
		})
	}
}

// TestRecreatedPodStartsAfterASpecPreparedForTheOldPod is a StatefulSet's
// web-0 deleted and created again (uid-new, 2048 MiB on GPU B) while the
// plugin's view still shows the old pod (uid-old, 40960 MiB on GPU B):
// GetPreferredAllocation offers the old pod's container, the only pending
// one in the view, and Allocate prepares its spec under the new
// container's name. The start confirms the new pod (the kubelet's device
// checkpoint and the API server), rewrites the spec for it and is refused;
// once the view shows the new pod and SpecSettle has passed, the retry
// starts the container with the new pod's own slice.
func TestRecreatedPodStartsAfterASpecPreparedForTheOldPod(t *testing.T) {
	f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
	clk := testingclock.NewFakeClock(time.Now())
	f.alloc.clock = clk
	old := gpuPod("web-0", time.Now().Add(-time.Hour), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 40960, 0)), "main")
	old.UID = "uid-old"
	f.addPod(old)
	recreated := recreatedWeb0()
	f.apiServerHas(recreated)
	ids, name := f.admitOne(1)
	f.alloc.drain()
	if got := envValue(specEnv(f.readSpec(ids...)), handoff.EnvPodUID); got != "uid-old" {
		t.Fatalf("spec prepared at Allocate names pod UID %q, want the old pod's (the view's)", got)
	}
	f.podRes.hold("default", "web-0", "main", ids...)
	f.kubeletCheckpointAnswer("uid-new", "main", &pluginapi.ContainerAllocateResponse{CdiDevices: []*pluginapi.CDIDevice{{Name: handoff.CDIQualifiedName(name)}}}, ids...)

	wantSettling(t, f, f.preStart(ids...), "of pod UID uid-old")
	wantRecreatedSpec(t, f, ids[0])
	f.deletePod("default", "web-0")
	f.addPod(recreated)
	wantSettling(t, f, f.preStart(ids...), "")
	clk.Step(f.alloc.t.SpecSettle)
	if err := f.preStart(ids...); err != nil {
		t.Fatalf("start of the new web-0 once the view shows it and the spec has settled: %v", err)
	}
	got := f.inject(handoff.CDIQualifiedName(name))
	if diff := cmp.Diff([]string{"uid-new", "2048m"}, []string{envValue(got.Process.Env, handoff.EnvPodUID), envValue(got.Process.Env, handoff.EnvMemoryLimitPrefix+"0")}); diff != "" {
		t.Errorf("the new web-0's CDI device as the runtime resolves it: pod UID, memory limit (-want +got):\n%s", diff)
	}
}

// wantSettling checks that err refuses a start because the container's
// spec was rewritten after a spec prepared for another container (its
// message containing also, when not ""), with a Warning event, and that
// it says the start is retried.
func wantSettling(t *testing.T, f *handoffFixture, err error, also string) {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "the start is retried") || !strings.Contains(err.Error(), also) {
		t.Fatalf("start with a spec prepared for another container = %v; want FailedPrecondition containing %q and saying the start is retried", err, also)
	}
	if ev := f.event(); !strings.Contains(ev, "Warning "+ReasonAllocationMismatch) {
		t.Errorf("event = %q, want a Warning %s", ev, ReasonAllocationMismatch)
	}
}

// TestCheckpointRefusesAnIncompletePreparedFor: a holding's preparedFor
// must name its container and pod UID; the error names the field.
func TestCheckpointRefusesAnIncompletePreparedFor(t *testing.T) {
	path := filepath.Join(t.TempDir(), checkpointFileName)
	ids := []string{DeviceID(gpuA, 1)}
	s := newClaimStore(path)
	s.hold(ids, time.Now(), &specOwner{Ref: containerRef{Namespace: "default", Pod: "p", Container: "main"}, PodUID: "uid-p"})
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	loaded, err := loadClaimStore(path)
	if err != nil || len(loaded.holdings) != 1 {
		t.Fatalf("loadClaimStore = %d holdings, %v; want 1", len(loaded.holdings), err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(data), `"uid-p"`, `""`, 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil { //nolint:gosec // G703: the test's own temporary folder.
		t.Fatal(err)
	}
	if s, err := loadClaimStore(path); err == nil || !strings.Contains(err.Error(), "holdings[0].preparedFor") || len(s.holdings) != 0 {
		t.Errorf("loadClaimStore of a preparedFor without a pod UID = %d holdings, %v; want none and an error naming holdings[0].preparedFor", len(s.holdings), err)
	}
}

package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/test/harness/devicemanager"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

const (
	resourceName = "hami.io/gpu"
	nodeName     = "node-1"
	// fakeGPUs is a mixed node: 3 GPUs, so 30 devices at the default split.
	fakeGPUs   = "2xA100-80GB,1xT4-16GB"
	gpuCount   = 3
	splitCount = deviceplugin.DefaultSplitCount
	allDevices = gpuCount * splitCount
	// coolDown is the re-probe delay after a device fault, short for tests.
	coolDown = 300 * time.Millisecond
	// waitLong bounds every wait on the kubelet or the API server.
	waitLong = 30 * time.Second
)

// runningPlugin is one gpuslice device plugin, as the binary runs it, on
// fake GPUs.
type runningPlugin struct {
	t      *testing.T
	cfg    deviceplugin.Config
	plugin *deviceplugin.Plugin
	fake   *nvidia.Fake
	cancel context.CancelFunc
	done   chan error
}

// startPlugin runs a plugin on dir until stop or the end of the test.
// client may be nil (no API server configured).
func startPlugin(t *testing.T, dir string, client deviceplugin.API) *runningPlugin {
	t.Helper()
	return startPluginWith(t, dir, client, nil)
}

// startPluginWith is startPlugin with configuration changes. By default the
// plugin's CDI specs and state live in dir (the kubelet deletes only
// sockets there), nothing serves its PodResources socket, and the fake
// GPUs (cfg.FakeGPUs) give the node facts. As the binary
// does, the GPU backend records GPUs that need a reset in the state folder,
// and with cfg.FakeGPUFaultsDir the fake GPUs keep their state in that
// folder and take faults from it.
func startPluginWith(t *testing.T, dir string, client deviceplugin.API, mutate func(*deviceplugin.Config)) *runningPlugin {
	t.Helper()
	cfg := deviceplugin.DefaultConfig()
	cfg.NodeName = nodeName
	cfg.DevicePluginDir = dir
	cfg.LeaseRenew.Duration = time.Second
	cfg.LeaseDuration.Duration = 5 * time.Second
	cfg.FakeGPUs = fakeGPUs // no /dev/nvidia* device nodes in CDI specs
	cfg.CDISpecDir = filepath.Join(dir, "cdi")
	cfg.PodResourcesSocket = filepath.Join(dir, "no-pod-resources.sock")
	if mutate != nil {
		mutate(&cfg)
	}
	fake, err := nvidia.NewFake(cfg.FakeGPUs, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	// The node facts of the spec, as the binary takes them (a ";cgroup=…"
	// fact, else unknown).
	ff := fake.Facts()
	facts := handoff.NodeFacts{DriverVersion: ff.DriverVersion, CgroupVersion: ff.CgroupVersion}
	if cfg.FakeGPUFaultsDir != "" {
		if err := fake.KeepStateIn(cfg.FakeGPUFaultsDir); err != nil {
			t.Fatal(err)
		}
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))
	backend, err := nvidia.Open(nvidia.Options{Library: fake, CoolDown: coolDown, EventWait: 20 * time.Millisecond, Logger: logger, FaultRecordDir: cfg.FaultRecordDir()})
	if err != nil {
		t.Fatal(err)
	}
	p, err := deviceplugin.New(cfg, backend, deviceplugin.Options{Client: client, PluginVersion: "test", Facts: facts})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	r := &runningPlugin{t: t, cfg: cfg, plugin: p, fake: fake, cancel: cancel, done: make(chan error, 1)}
	faults := make(chan struct{})
	go func() {
		defer close(faults)
		if cfg.FakeGPUFaultsDir != "" {
			_ = fake.ServeFaults(ctx, cfg.FakeGPUFaultsDir, nvidia.FaultOptions{})
		}
	}()
	go func() {
		r.done <- p.Run(ctx)
		<-faults
		_ = backend.Close()
	}()
	t.Cleanup(r.stop)
	return r
}

// stop ends the plugin and waits for Run to return. Idempotent.
func (r *runningPlugin) stop() {
	r.cancel()
	if err, ok := <-r.done; ok {
		close(r.done)
		if err != nil {
			r.t.Errorf("plugin Run returned %v", err)
		}
	}
}

func waitCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitUntil polls cond until it holds or the deadline passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, d, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// startRegistered starts a device manager and a plugin on a fresh folder and
// waits until the kubelet reports every device allocatable.
func startRegistered(t *testing.T) (string, *devicemanager.Manager, *runningPlugin) {
	t.Helper()
	dir := t.TempDir()
	m := devicemanager.Start(t, dir)
	p := startPlugin(t, dir, nil)
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, allDevices, allDevices); err != nil {
		t.Fatal(err)
	}
	return dir, m, p
}

// Scenario 1: the plugin serves, then registers: the real kubelet accepts it
// and reports GPUs x splitCount devices.
func TestRegisterAfterServe(t *testing.T) {
	t.Parallel()
	startRegistered(t)
}

// Scenario 1, reversed: registering an endpoint before anything serves it
// reproduces the failure plugins written for kubelets before 1.25 hit: the
// kubelet dials back inside Register and gives up after 10 s.
func TestRegisterBeforeServeFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := devicemanager.Start(t, dir)
	err := deviceplugin.Register(waitCtx(t, waitLong), m.SocketPath(), "not-served-yet.sock", "example.com/reversed", nil)
	const want = "failed to dial device plugin: context deadline exceeded"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Register before serve = %v, want an error containing %q", err, want)
	}
	if capacity, _ := m.Resource("example.com/reversed"); capacity != 0 {
		t.Errorf("capacity %d after a failed registration, want 0", capacity)
	}
}

// Scenario 2: an XID device fault takes one GPU's devices out of
// allocatable (capacity stays); an application XID does not; the GPU comes
// back after the cool-down once it was reset.
func TestHealth(t *testing.T) {
	t.Parallel()
	_, m, p := startRegistered(t)
	all := int64(allDevices)
	waitUntil(t, waitLong, "the health watch on every GPU", func() bool { return p.fake.Watched(0) && p.fake.Watched(1) })

	// Keep GPU 0 lost so the first re-probe fails and the fault is visible.
	if err := p.fake.SetLost(0, true); err != nil {
		t.Fatal(err)
	}
	// Events arrive in order: when XID 79's effect shows, XID 13 was handled.
	if err := p.fake.InjectXID(1, 13); err != nil {
		t.Fatal(err)
	}
	if err := p.fake.InjectXID(0, 79); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, all, all-splitCount); err != nil {
		t.Fatalf("after XID 13 on GPU 1 and XID 79 on GPU 0: %v", err)
	}

	// XID 79 needs a reboot: the GPU comes back once it was reset, not as
	// soon as it answers.
	if err := p.fake.ResetGPU(0); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, all, all); err != nil {
		t.Fatalf("after GPU 0 was reset: %v", err)
	}
}

// Scenario 3: a kubelet restart (a new device manager on the same folder
// wipes every socket) is followed by re-registration within 5 s, 20 times
// in a row.
func TestKubeletRestart(t *testing.T) {
	t.Parallel()
	dir, m, p := startRegistered(t)
	all := int64(allDevices)
	var slowest time.Duration
	for i := range 20 {
		m.Stop()
		began := time.Now()
		m = devicemanager.Start(t, dir)
		if err := m.WaitResource(waitCtx(t, 5*time.Second), resourceName, all, all); err != nil {
			t.Fatalf("restart %d: %v", i+1, err)
		}
		slowest = max(slowest, time.Since(began))
	}
	t.Logf("20 kubelet restarts; slowest re-registration %v", slowest.Round(time.Millisecond))
	// Stop the plugin while the last manager still runs and wait until that
	// manager has seen it go, so no manager writes its checkpoint into the
	// folder while the test removes it.
	p.stop()
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, all, 0); err != nil {
		t.Fatalf("plugin stopped: %v", err)
	}
}

// Scenario 4: the plugin restarts; the kubelet drops allocatable at once,
// then gets the devices back, and a pod admitted afterwards starts with its
// own slice.
func TestPluginRestart(t *testing.T) {
	t.Parallel()
	h := newHandoffEnv(t, deviceplugin.ModeCDI)
	p := h.start()
	all := int64(allDevices)
	p.stop()
	if err := h.m.WaitResource(waitCtx(t, waitLong), resourceName, all, 0); err != nil {
		t.Fatalf("plugin stopped: %v", err)
	}
	h.start()

	pod := h.createPod("after-restart", time.Now(), vgputest.Allocation(nodeName).Container("main").Slice(fakeGPU(2), 4096, 10))
	if err := h.m.Allocate(pod, &pod.Spec.Containers[0]); err != nil {
		t.Fatalf("kubelet Allocate: %v", err)
	}
	env := h.startContainer(pod, "main")
	if got := env[handoff.EnvVisibleDevices]; got != fakeGPU(2) {
		t.Errorf("%s=%q, want the scheduler's GPU %s", handoff.EnvVisibleDevices, got, fakeGPU(2))
	}
}

// Re-registration on request (SIGHUP in the binary) moves to a fresh
// socket; the kubelet keeps the devices.
func TestReregisterOnRequest(t *testing.T) {
	t.Parallel()
	dir, m, p := startRegistered(t)
	all := int64(allDevices)
	before := pluginSockets(t, dir)
	p.plugin.Reregister()
	waitUntil(t, waitLong, "a fresh plugin socket", func() bool {
		now := pluginSockets(t, dir)
		return len(now) == 1 && len(before) == 1 && now[0] != before[0] && p.plugin.Registered()
	})
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, all, all); err != nil {
		t.Fatal(err)
	}
}

func pluginSockets(t *testing.T, dir string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "gpuslice-*.sock"))
	if err != nil {
		t.Fatal(err)
	}
	return matches
}

// Scenario 5: the kubelet is absent when the plugin starts and appears 10 s
// later: the plugin registers without a restart.
func TestKubeletAbsentAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := startPlugin(t, dir, nil)
	// The scenario itself is "the kubelet comes 10 s later"; this is not a
	// synchronisation sleep.
	<-time.After(10 * time.Second)
	if p.plugin.Registered() {
		t.Fatal("registered with no kubelet")
	}
	if _, err := os.Stat(filepath.Join(dir, "kubelet.sock")); err == nil {
		t.Fatal("kubelet.sock exists before the kubelet started")
	}
	m := devicemanager.Start(t, dir)
	all := int64(gpuCount * splitCount)
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, all, all); err != nil {
		t.Fatal(err)
	}
}

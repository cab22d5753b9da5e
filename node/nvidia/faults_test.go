package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpuslice/gpuslice/vgpu"
)

// serveFaults runs f.ServeFaults on dir with a fake clock until the test
// ends, and returns the clock.
func serveFaults(ctx context.Context, t *testing.T, f *Fake, dir string) *testingclock.FakeClock {
	t.Helper()
	clk := testingclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.ServeFaults(ctx, dir, FaultOptions{Clock: clk}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("ServeFaults after cancel = %v, want context.Canceled", err)
		}
	})
	return clk
}

// scanAgain ticks clk once ServeFaults's ticker exists, so that it reads the folder again.
func scanAgain(t *testing.T, clk *testingclock.FakeClock) {
	t.Helper()
	waitFor(t, "ServeFaults ticking", clk.HasWaiters)
	clk.Step(DefaultFaultScan)
}

// writeFault writes fault into dir, failing the test on error.
func writeFault(t *testing.T, dir string, fault FakeFault) string {
	t.Helper()
	path, err := WriteFakeFault(dir, fault)
	if err != nil {
		t.Fatalf("WriteFakeFault(%v): %v", fault, err)
	}
	return path
}

// gone reports whether path no longer exists.
func gone(path string) bool {
	_, err := os.Stat(path)
	return errors.Is(err, os.ErrNotExist)
}

// TestFaultFolderDrivesHealth writes faults into the folder of a running
// ServeFaults over a Backend that watches health, as a test does to a
// running --fake-gpus plugin: a needs-reset XID takes the GPU out with its
// recovery action pending, a reset clears the action and the re-probe after
// the cool-down brings the GPU back.
func TestFaultFolderDrivesHealth(t *testing.T) {
	f := newFixture(t, "2xA100-80GB")
	events, _ := f.watchReady(0, 1)
	dir := t.TempDir()
	clk := serveFaults(f.ctx, t, f.fake, dir)

	xid := writeFault(t, dir, FakeFault{GPU: 1, XID: 48})
	scanAgain(t, clk)
	ev := next(t, events)
	if ev.UUID != FakeUUID(testNode, 1) || ev.Health != vgpu.Unhealthy || !strings.Contains(ev.Reason, "XID 48") {
		t.Errorf("health event %+v; want GPU 1 unhealthy for XID 48", ev)
	}
	waitFor(t, "XID file removed once applied", func() bool { return gone(xid) })
	if got := f.fake.RecoveryAction(1); got != nvml.GPU_RECOVERY_ACTION_GPU_RESET {
		t.Errorf("recovery action after XID 48 = %v, want GPU_RESET", got)
	}

	// The re-probe after the cool-down still finds a reset pending, and schedules the next.
	waitFor(t, "re-probe scheduled", f.clock.HasWaiters)
	f.clock.Step(testCoolDown)
	waitFor(t, "next re-probe scheduled", f.clock.HasWaiters)
	noEvent(t, events)

	reset := writeFault(t, dir, FakeFault{GPU: 1, Reset: true})
	scanAgain(t, clk)
	waitFor(t, "reset file removed once applied", func() bool { return gone(reset) })
	if got := f.fake.RecoveryAction(1); got != nvml.GPU_RECOVERY_ACTION_NONE {
		t.Errorf("recovery action after the reset = %v, want NONE", got)
	}
	f.clock.Step(testCoolDown)
	if ev := next(t, events); ev.UUID != FakeUUID(testNode, 1) || ev.Health != vgpu.Healthy {
		t.Errorf("health event %+v; want GPU 1 healthy again after the reset", ev)
	}
}

// TestFaultFolderRetriesAndRejects checks the folder's other outcomes: an
// XID for a GPU nobody watches yet stays until a watcher registers, and a
// file that names no fault, or a GPU that does not exist, is set aside as
// rejected while other files are left alone.
func TestFaultFolderRetriesAndRejects(t *testing.T) {
	f := newFixture(t, "1xT4-16GB")
	dir := t.TempDir()
	notes := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notes, []byte("not a fault"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Written before ServeFaults starts, in this order: the first read
	// handles the pending XID first, so once the last file is rejected the
	// XID has been tried.
	pending := writeFault(t, dir, FakeFault{GPU: 0, XID: 13})
	var rejected []string
	for _, body := range []string{`{"gpu": 0}`, `{"gpu": 0, "xid": 13, "reset": true}`, `{"gpu": 0, "xid": 13, "lost": true}`, `not json`, `{"gpu": 3, "xid": 13}`} {
		path := filepath.Join(dir, fmt.Sprintf("z-%d.json", len(rejected)))
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		rejected = append(rejected, path)
	}
	clk := serveFaults(f.ctx, t, f.fake, dir)
	for _, path := range rejected {
		waitFor(t, filepath.Base(path)+" rejected", func() bool { return !gone(path + RejectedSuffix) })
	}
	if gone(pending) {
		t.Fatal("the XID for an unwatched GPU was dropped; want it kept until a watcher registers")
	}
	if gone(notes) {
		t.Error("a file that is not a fault was removed")
	}

	dev, _ := f.fake.DeviceGetHandleByIndex(0)
	set, _ := f.fake.EventSetCreate()
	t.Cleanup(func() { _ = set.Free() })
	if got := dev.RegisterEvents(nvml.EventTypeXidCriticalError, set); got != nvml.SUCCESS {
		t.Fatalf("RegisterEvents = %v", got)
	}
	scanAgain(t, clk)
	waitFor(t, "pending XID applied once watched", func() bool { return gone(pending) })
	data, ret := set.Wait(0)
	if diff := cmp.Diff(uint64(13), data.EventData); ret != nvml.SUCCESS || diff != "" {
		t.Errorf("event after registering: %v, XID (-want +got):\n%s", ret, diff)
	}
}

// TestFaultFolderSetsActivity: an activity file replaces what runs on a
// fake GPU, as the Backend then reads it; a later one replaces it again.
func TestFaultFolderSetsActivity(t *testing.T) {
	f := newFixture(t, "2xA100-80GB")
	dir := t.TempDir()
	clk := serveFaults(f.ctx, t, f.fake, dir)
	used := writeFault(t, dir, FakeFault{GPU: 1, Activity: &FakeActivity{Processes: []FakeProcess{{PID: 4242, MemoryMiB: 12288}}, UtilizationPercent: 60}})
	scanAgain(t, clk)
	waitFor(t, "activity file applied", func() bool { return gone(used) })
	got, err := f.b.Activity()
	if err != nil {
		t.Fatal(err)
	}
	want := []vgpu.GPUActivity{
		{UUID: FakeUUID(testNode, 0)},
		{UUID: FakeUUID(testNode, 1), MemoryUsedMiB: 12288, UtilizationPercent: 60, Processes: []vgpu.ProcessUsage{{PID: 4242, MemoryMiB: 12288}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Activity after the activity file (-want +got):\n%s", diff)
	}
	idle := writeFault(t, dir, FakeFault{GPU: 1, Activity: &FakeActivity{}})
	scanAgain(t, clk)
	waitFor(t, "idle file applied", func() bool { return gone(idle) })
	if got, err := f.b.Activity(); err != nil || got[1].MemoryUsedMiB != 0 || len(got[1].Processes) != 0 {
		t.Errorf("Activity after an empty activity = %+v, %v; want GPU 1 idle", got, err)
	}
}

func TestWriteFakeFaultValidates(t *testing.T) {
	dir := t.TempDir()
	for _, fault := range []FakeFault{{GPU: 0}, {GPU: -1, XID: 13}, {GPU: 0, XID: 13, Reset: true},
		{GPU: 0, XID: 13, Activity: &FakeActivity{}}, {GPU: 0, Activity: &FakeActivity{UtilizationPercent: 101}}} {
		if _, err := WriteFakeFault(dir, fault); err == nil || !strings.Contains(err.Error(), "fault") {
			t.Errorf("WriteFakeFault(%+v) = %v; want an error naming the fault", fault, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("invalid faults left %d files", len(entries))
	}
}

// TestFaultFolderResetSurvivesRestart: fake GPUs that keep their state in
// the faults folder model a pending reset across a plugin restart: after a
// needs-reset XID from a fault file, new fake GPUs on the same folder (the
// restarted plugin's) still report the reset pending, so the new Backend
// holds the GPU unhealthy from its first listing; a reset fault file clears
// it for good.
func TestFaultFolderResetSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	keep := func(fake *Fake) {
		t.Helper()
		if err := fake.KeepStateIn(dir); err != nil {
			t.Fatalf("KeepStateIn: %v", err)
		}
	}
	f := newFixtureWith(t, "2xA100-80GB", func(fake *Fake, _ *Options) { keep(fake) })
	events, stop := f.watchReady(0, 1)
	ctx, stopFaults := context.WithCancel(f.ctx)
	clk := serveFaults(ctx, t, f.fake, dir)
	writeFault(t, dir, FakeFault{GPU: 1, XID: 48})
	scanAgain(t, clk)
	if ev := next(t, events); ev.Health != vgpu.Unhealthy {
		t.Fatalf("event %+v, want Unhealthy", ev)
	}
	stopFaults()
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	f.restart(func() *Fake {
		fake, err := NewFake("2xA100-80GB", testNode)
		if err != nil {
			t.Fatal(err)
		}
		keep(fake)
		return fake
	}, nil)
	if got := f.fake.RecoveryAction(1); got != nvml.GPU_RECOVERY_ACTION_GPU_RESET {
		t.Errorf("recovery action after the restart = %v, want GPU_RESET", got)
	}
	if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Unhealthy}, f.health()); diff != "" {
		t.Fatalf("GPUs health after the restart (-want +got):\n%s", diff)
	}
	events, _ = f.watchReady(0, 1)
	clk = serveFaults(f.ctx, t, f.fake, dir)
	reset := writeFault(t, dir, FakeFault{GPU: 1, Reset: true})
	scanAgain(t, clk)
	waitFor(t, "reset file applied", func() bool { return gone(reset) })
	waitFor(t, "probe scheduled", f.clock.HasWaiters)
	f.clock.Step(testCoolDown)
	if ev := next(t, events); ev.UUID != FakeUUID(testNode, 1) || ev.Health != vgpu.Healthy {
		t.Errorf("event %+v, want GPU 1 Healthy after the reset", ev)
	}

	again, err := NewFake("2xA100-80GB", testNode)
	if err != nil {
		t.Fatal(err)
	}
	keep(again)
	if got := again.RecoveryAction(1); got != nvml.GPU_RECOVERY_ACTION_NONE {
		t.Errorf("recovery action kept after the reset = %v, want NONE", got)
	}
}

package nvidia

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
)

const testBootID = "boot-1"

// withRecords keeps fault records in a new folder, under boot testBootID.
func withRecords(t *testing.T) func(*Fake, *Options) {
	dir := filepath.Join(t.TempDir(), "gpu-faults")
	return func(_ *Fake, o *Options) {
		o.FaultRecordDir = dir
		o.BootID = testBootID
	}
}

// record reads the fault record of GPU index; nil when there is none.
func (f *fixture) record(index int) *faultRecord {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.opts.FaultRecordDir, FakeUUID(testNode, index)+faultRecordSuffix))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	var rec faultRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		f.t.Fatalf("record of GPU %d: %v", index, err)
	}
	return &rec
}

// TestPendingResetSurvivesRestart: a GPU that needs a reset is not put
// back into service by a plugin restart (a new Backend over the same GPUs)
// before it was reset: the new Backend reads NVML's pending recovery action
// at Open, with or without a fault record, and GPUs reports the GPU
// Unhealthy from the first call. After the reset the probe brings it back.
func TestPendingResetSurvivesRestart(t *testing.T) {
	const xid48 = "XID 48: double-bit ECC error (needs a GPU reset)"
	tests := []struct {
		name       string
		mutate     func(*Fake, *Options)
		wantReason string
	}{
		{name: "NVML's recovery action", wantReason: "NVML reports recovery action GPU reset pending at start"},
		{name: "fault record", mutate: withRecords(t), wantReason: xid48},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixtureWith(t, "2xA100-80GB", tt.mutate)
			events, stop := f.watchReady(0, 1)
			f.inject(1, 48)
			if got := next(t, events); got.Health != vgpu.Unhealthy {
				t.Fatalf("event %+v, want Unhealthy", got)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}

			f.restart(nil, nil)
			if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Unhealthy}, f.health()); diff != "" {
				t.Fatalf("GPUs health after the restart (-want +got):\n%s", diff)
			}
			events, _ = f.watchReady(0)
			for range 2 {
				waitFor(t, "probe scheduled", f.clock.HasWaiters)
				f.clock.Step(testCoolDown)
			}
			waitFor(t, "next probe scheduled", f.clock.HasWaiters)
			noEvent(t, events)

			if err := f.fake.ResetGPU(1); err != nil {
				t.Fatal(err)
			}
			f.clock.Step(testCoolDown)
			want := vgpu.HealthEvent{UUID: FakeUUID(testNode, 1), Health: vgpu.Healthy, Reason: "GPU was reset after " + tt.wantReason}
			if diff := cmp.Diff(want, next(t, events)); diff != "" {
				t.Errorf("recovery event (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFaultRecordWrittenAndCleared: the record of a fault that needs a
// reset holds its XID, when it began, that NVML showed the reset pending
// and the boot; it is removed once the GPU is back, so a restart after the
// reset finds the GPU healthy.
func TestFaultRecordWrittenAndCleared(t *testing.T) {
	f := newFixtureWith(t, "2xH100-80GB", withRecords(t))
	events, stop := f.watchReady(0, 1)
	f.clock.Step(time.Hour)
	f.inject(0, 79)
	next(t, events)
	want := &faultRecord{
		Version: faultRecordVersion, UUID: FakeUUID(testNode, 0), XID: 79, NeedsReset: true,
		Reason: "XID 79: GPU has fallen off the bus (needs a reboot)", Since: f.clock.Now(), PendingSeen: true, BootID: testBootID,
	}
	if diff := cmp.Diff(want, f.record(0)); diff != "" {
		t.Errorf("record after XID 79 (-want +got):\n%s", diff)
	}
	// A recoverable fault is not recorded.
	f.inject(1, 74)
	next(t, events)
	if got := f.record(1); got != nil {
		t.Errorf("record of a recoverable fault: %+v, want none", got)
	}

	if err := f.fake.ResetGPU(0); err != nil {
		t.Fatal(err)
	}
	f.clock.Step(testCoolDown)
	for range 2 {
		if got := next(t, events); got.Health != vgpu.Healthy {
			t.Fatalf("event %+v, want Healthy", got)
		}
	}
	if got := f.record(0); got != nil {
		t.Errorf("record after the reset: %+v, want none", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.restart(nil, nil)
	if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Healthy}, f.health()); diff != "" {
		t.Errorf("GPUs health after a restart (-want +got):\n%s", diff)
	}
}

// TestFaultRecordOnDriverWithoutRecoveryAction: where NVML cannot report
// the recovery action, only the record knows the GPU needs a reset: a
// restart keeps it out even after the reset, since nothing shows it; a
// reboot (another boot ID) or removing the record brings it back.
func TestFaultRecordOnDriverWithoutRecoveryAction(t *testing.T) {
	tests := []struct {
		name    string
		restart func(f *fixture, o *Options)
		want    vgpu.Health
		kept    bool
	}{
		{name: "restart", restart: func(*fixture, *Options) {}, want: vgpu.Unhealthy, kept: true},
		{name: "reboot", restart: func(_ *fixture, o *Options) { o.BootID = "boot-2" }, want: vgpu.Healthy},
		{name: "record removed", restart: func(f *fixture, _ *Options) {
			if err := os.Remove(filepath.Join(f.opts.FaultRecordDir, FakeUUID(testNode, 0)+faultRecordSuffix)); err != nil {
				f.t.Fatal(err)
			}
		}, want: vgpu.Healthy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixtureWith(t, "1xL4-24GB", withRecords(t))
			if err := f.fake.SetRecoveryActionUnsupported(0, true); err != nil {
				t.Fatal(err)
			}
			events, stop := f.watchReady(0)
			f.inject(0, 95)
			next(t, events)
			if err := f.fake.ResetGPU(0); err != nil {
				t.Fatal(err)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			f.restart(nil, func(o *Options) { tt.restart(f, o) })
			if diff := cmp.Diff([]vgpu.Health{tt.want}, f.health()); diff != "" {
				t.Errorf("GPUs health after the %s (-want +got):\n%s", tt.name, diff)
			}
			if got := f.record(0) != nil; got != tt.kept {
				t.Errorf("record kept: %v, want %v", got, tt.kept)
			}
		})
	}
}

// TestUnreadableFaultRecordHoldsGPU: a record that cannot be read still
// holds its GPU (its name gives the UUID) and is written again whole.
func TestUnreadableFaultRecordHoldsGPU(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FakeUUID(testNode, 1)+faultRecordSuffix), []byte(`{"version": 1, "uu`), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFixtureWith(t, "2xT4-16GB", func(_ *Fake, o *Options) { o.FaultRecordDir = dir })
	if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Unhealthy}, f.health()); diff != "" {
		t.Errorf("GPUs health (-want +got):\n%s", diff)
	}
	if rec := f.record(1); rec == nil || rec.UUID != FakeUUID(testNode, 1) || !rec.NeedsReset {
		t.Errorf("record rewritten as %+v, want one for GPU 1 that needs a reset", rec)
	}
}

func TestRestoredFault(t *testing.T) {
	since := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := func(pendingSeen bool, boot string) *faultRecord {
		return &faultRecord{UUID: "GPU-a", XID: 48, NeedsReset: true, Reason: "XID 48", Since: since, PendingSeen: pendingSeen, BootID: boot}
	}
	held := fault{reason: "XID 48", xid: 48, since: since, resetRequired: true, downSeen: true}
	heldNotDown := held
	heldNotDown.downSeen = false
	unsupported := errors.Join(errResetNotReported, nvml.ERROR_NOT_SUPPORTED)
	tests := []struct {
		name   string
		rec    *faultRecord
		action nvml.DeviceGpuRecoveryAction
		err    error
		want   fault
		faulty bool
	}{
		{name: "nothing", action: nvml.GPU_RECOVERY_ACTION_NONE},
		{name: "no field, no record", err: unsupported},
		{name: "action pending, no record", action: nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, faulty: true,
			want: fault{reason: "NVML reports recovery action node reboot pending at start", resetRequired: true, downSeen: true}},
		{name: "recorded, still pending", rec: rec(true, testBootID), action: nvml.GPU_RECOVERY_ACTION_GPU_RESET, want: held, faulty: true},
		{name: "recorded, pending after a reboot", rec: rec(true, "boot-0"), action: nvml.GPU_RECOVERY_ACTION_GPU_RESET, want: held, faulty: true},
		{name: "recorded pending, now none: reset", rec: rec(true, testBootID), action: nvml.GPU_RECOVERY_ACTION_NONE},
		{name: "recorded never pending, now none", rec: rec(false, testBootID), action: nvml.GPU_RECOVERY_ACTION_NONE, want: heldNotDown, faulty: true},
		{name: "recorded, no field", rec: rec(true, testBootID), err: unsupported, want: held, faulty: true},
		{name: "recorded, no field, rebooted", rec: rec(false, "boot-0"), err: unsupported},
		{name: "recorded, boot unknown", rec: rec(false, ""), err: unsupported, want: heldNotDown, faulty: true},
		{name: "recorded, lost", rec: rec(false, testBootID), err: nvml.ERROR_GPU_IS_LOST, want: held, faulty: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, faulty, note := restoredFault(tt.rec, tt.action, tt.err, testBootID)
			if faulty != tt.faulty {
				t.Errorf("faulty = %v (%s), want %v", faulty, note, tt.faulty)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(fault{})); diff != "" {
				t.Errorf("fault (-want +got):\n%s", diff)
			}
		})
	}
}

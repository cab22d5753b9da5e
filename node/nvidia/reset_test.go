package nvidia

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/vgpu"
)

// TestResetRequiredFaultStaysUntilReset: after an XID whose catalogue
// action is a GPU reset or a reboot, NVML still answers, yet the GPU must
// not flap back into service at the next probe; it returns once NVML shows
// it was reset.
func TestResetRequiredFaultStaysUntilReset(t *testing.T) {
	for _, xid := range []uint64{48, 64, 79, 95, 119, 120} {
		t.Run(fmt.Sprintf("XID %d", xid), func(t *testing.T) {
			f := newFixture(t, "2xA100-80GB")
			events, _ := f.watchReady(0, 1)
			uuid := FakeUUID(testNode, 1)
			class := ClassifyXID(xid)
			reason := fmt.Sprintf("XID %d: %s (needs %s)", xid, class.Description, resetWord(class))

			f.inject(1, xid)
			want := vgpu.HealthEvent{UUID: uuid, Health: vgpu.Unhealthy, Reason: reason}
			if diff := cmp.Diff(want, next(t, events)); diff != "" {
				t.Fatalf("fault event (-want +got):\n%s", diff)
			}
			for range 3 {
				f.clock.Step(testCoolDown)
				// The probe finds NVML answering with a reset pending, and
				// sets the next one.
				waitFor(t, "next probe scheduled", f.clock.HasWaiters)
				noEvent(t, events)
			}
			if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Unhealthy}, f.health()); diff != "" {
				t.Errorf("GPUs health before the reset (-want +got):\n%s", diff)
			}

			if err := f.fake.ResetGPU(1); err != nil {
				t.Fatal(err)
			}
			f.clock.Step(testCoolDown)
			want = vgpu.HealthEvent{UUID: uuid, Health: vgpu.Healthy, Reason: "GPU was reset after " + reason}
			if diff := cmp.Diff(want, next(t, events)); diff != "" {
				t.Fatalf("recovery event (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Healthy}, f.health()); diff != "" {
				t.Errorf("GPUs health after the reset (-want +got):\n%s", diff)
			}
		})
	}
}

// TestResetRequiredWithoutRecoveryField: a driver that cannot report the
// recovery action cannot show a reset, so the GPU stays unhealthy even
// after ResetGPU; a new backend (the plugin restarting after the reset)
// starts with it healthy.
func TestResetRequiredWithoutRecoveryField(t *testing.T) {
	f := newFixture(t, "2xL4-24GB")
	if err := f.fake.SetRecoveryActionUnsupported(0, true); err != nil {
		t.Fatal(err)
	}
	events, stop := f.watchReady(0)
	f.inject(0, 95)
	if got := next(t, events); got.Health != vgpu.Unhealthy {
		t.Fatalf("event = %+v, want Unhealthy", got)
	}
	if err := f.fake.ResetGPU(0); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		f.clock.Step(testCoolDown)
		waitFor(t, "next probe scheduled", f.clock.HasWaiters)
		noEvent(t, events)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	restarted, err := Open(Options{Library: f.fake, CoolDown: testCoolDown, EventWait: 5 * time.Millisecond, Clock: f.clock, Logger: klog.FromContext(f.ctx)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = restarted.Close() })
	f.b = restarted
	if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Healthy}, f.health()); diff != "" {
		t.Errorf("GPUs health after a plugin restart (-want +got):\n%s", diff)
	}
}

package nvidia

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/vgpu"
)

func TestApplicationFaultKeepsGPUHealthy(t *testing.T) {
	f := newFixture(t, "dgxa100")
	events, _ := f.watchReady(1, 2)

	for _, xid := range []uint64{13, 31, 43, 63, 94} {
		f.inject(1, xid)
	}
	// Events are handled in order: once GPU 2's event arrives, GPU 1's
	// XIDs have been handled without an event.
	f.inject(2, 79)

	want := vgpu.HealthEvent{UUID: FakeUUID(testNode, 2), Health: vgpu.Unhealthy, Reason: "XID 79: GPU has fallen off the bus (needs a reboot)"}
	if diff := cmp.Diff(want, next(t, events)); diff != "" {
		t.Errorf("first event (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(healthAll(8, vgpu.Healthy, vgpu.Unhealthy, 2), f.health()); diff != "" {
		t.Errorf("GPUs health (-want +got):\n%s", diff)
	}
	if got := f.clock.Waiters(); got != 1 {
		t.Errorf("probe timers = %d, want 1 (GPU 2 only)", got)
	}
}

func TestDeviceFaultRecoversAfterCoolDown(t *testing.T) {
	for _, xid := range []uint64{54, 74, 999} {
		t.Run(fmt.Sprintf("XID %d", xid), func(t *testing.T) {
			f := newFixture(t, "2xA100-80GB")
			events, _ := f.watchReady(0, 1)
			uuid := FakeUUID(testNode, 1)
			reason := fmt.Sprintf("XID %d: %s", xid, ClassifyXID(xid).Description)

			f.inject(1, xid)
			want := vgpu.HealthEvent{UUID: uuid, Health: vgpu.Unhealthy, Reason: reason}
			if diff := cmp.Diff(want, next(t, events)); diff != "" {
				t.Fatalf("fault event (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Unhealthy}, f.health()); diff != "" {
				t.Errorf("GPUs health while faulty (-want +got):\n%s", diff)
			}

			f.clock.Step(testCoolDown)
			want = vgpu.HealthEvent{UUID: uuid, Health: vgpu.Healthy, Reason: "GPU answers NVML again after " + reason}
			if diff := cmp.Diff(want, next(t, events)); diff != "" {
				t.Fatalf("recovery event (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Healthy}, f.health()); diff != "" {
				t.Errorf("GPUs health after recovery (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLostGPUStaysUnhealthyUntilReset(t *testing.T) {
	f := newFixture(t, "dgxh100")
	if _, err := f.b.GPUs(); err != nil { // remember the GPUs, as the plugin does
		t.Fatalf("GPUs: %v", err)
	}
	events, _ := f.watchReady(5)
	uuid := FakeUUID(testNode, 5)

	f.inject(5, 79)
	if got := next(t, events); got.Health != vgpu.Unhealthy || got.UUID != uuid {
		t.Fatalf("fault event = %+v, want GPU 5 Unhealthy", got)
	}
	if err := f.fake.SetLost(5, true); err != nil {
		t.Fatal(err)
	}
	// GPUs still lists the lost GPU, from its last record.
	if diff := cmp.Diff(healthAll(8, vgpu.Healthy, vgpu.Unhealthy, 5), f.health()); diff != "" {
		t.Errorf("GPUs health while lost (-want +got):\n%s", diff)
	}

	for range 3 {
		f.clock.Step(testCoolDown)
		// The probe fails and sets the next one on the clock.
		waitFor(t, "next probe scheduled", f.clock.HasWaiters)
		noEvent(t, events)
	}

	if err := f.fake.ResetGPU(5); err != nil {
		t.Fatal(err)
	}
	f.clock.Step(testCoolDown)
	want := vgpu.HealthEvent{UUID: uuid, Health: vgpu.Healthy, Reason: "GPU was reset after XID 79: GPU has fallen off the bus (needs a reboot)"}
	if diff := cmp.Diff(want, next(t, events)); diff != "" {
		t.Errorf("recovery event (-want +got):\n%s", diff)
	}
}

func TestRepeatedFaultSendsOneEvent(t *testing.T) {
	f := newFixture(t, "dgxa100")
	events, _ := f.watchReady(0, 1)

	f.inject(0, 79)
	f.inject(0, 48)
	f.inject(1, 74) // handled after both faults on GPU 0
	got := []vgpu.HealthEvent{next(t, events), next(t, events)}
	want := []vgpu.HealthEvent{
		{UUID: FakeUUID(testNode, 0), Health: vgpu.Unhealthy, Reason: "XID 79: GPU has fallen off the bus (needs a reboot)"},
		{UUID: FakeUUID(testNode, 1), Health: vgpu.Unhealthy, Reason: "XID 74: NVLink error"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got := f.clock.Waiters(); got != 2 {
		t.Errorf("probe timers = %d, want 2 (one per unhealthy GPU)", got)
	}
}

func TestGPUThatCannotReportEventsIsLeftAlone(t *testing.T) {
	f := newFixture(t, "2xT4-16GB")
	if err := f.fake.SetEventsUnsupported(0, true); err != nil {
		t.Fatal(err)
	}
	events, _ := f.watchReady(1)

	if err := f.fake.InjectXID(0, 79); !errors.Is(err, ErrNotWatched) {
		t.Errorf("InjectXID on GPU 0 = %v, want ErrNotWatched", err)
	}
	f.inject(1, 13)
	noEvent(t, events)
	if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Healthy}, f.health()); diff != "" {
		t.Errorf("GPUs health (-want +got):\n%s", diff)
	}
}

func TestGPULostAtStartIsProbed(t *testing.T) {
	f := newFixture(t, "4xH100-80GB")
	if _, err := f.b.GPUs(); err != nil {
		t.Fatalf("GPUs: %v", err)
	}
	if err := f.fake.SetLost(3, true); err != nil {
		t.Fatal(err)
	}
	events, _ := f.watchReady(0, 1, 2)
	uuid := FakeUUID(testNode, 3)
	want := vgpu.HealthEvent{UUID: uuid, Health: vgpu.Unhealthy, Reason: "GPU 3 does not answer NVML: ERROR_GPU_IS_LOST"}
	if diff := cmp.Diff(want, next(t, events)); diff != "" {
		t.Fatalf("event (-want +got):\n%s", diff)
	}

	if err := f.fake.SetLost(3, false); err != nil {
		t.Fatal(err)
	}
	f.clock.Step(testCoolDown)
	if got := next(t, events); got.UUID != uuid || got.Health != vgpu.Healthy {
		t.Fatalf("event = %+v, want GPU 3 Healthy", got)
	}
	// The probe also registered the GPU for XIDs.
	waitFor(t, "GPU 3 watched", func() bool { return f.fake.Watched(3) })
	f.inject(3, 79)
	if got := next(t, events); got.UUID != uuid || got.Health != vgpu.Unhealthy {
		t.Fatalf("event = %+v, want GPU 3 Unhealthy", got)
	}
}

func TestHealthOutlivesWatchHealth(t *testing.T) {
	f := newFixture(t, "dgxb200")
	events, stop := f.watchReady(7)
	f.inject(7, 74)
	if got := next(t, events); got.Health != vgpu.Unhealthy {
		t.Fatalf("event = %+v, want Unhealthy", got)
	}
	if err := stop(); err != nil {
		t.Fatalf("WatchHealth = %v, want nil", err)
	}
	if f.fake.Watched(7) {
		t.Error("event set still registered after WatchHealth returned")
	}
	if diff := cmp.Diff(healthAll(8, vgpu.Healthy, vgpu.Unhealthy, 7), f.health()); diff != "" {
		t.Errorf("GPUs health between watches (-want +got):\n%s", diff)
	}

	events, _ = f.watch()
	waitFor(t, "probe of GPU 7 scheduled", f.clock.HasWaiters)
	f.clock.Step(testCoolDown)
	want := vgpu.HealthEvent{UUID: FakeUUID(testNode, 7), Health: vgpu.Healthy, Reason: "GPU answers NVML again after XID 74: NVLink error"}
	if diff := cmp.Diff(want, next(t, events)); diff != "" {
		t.Errorf("recovery event (-want +got):\n%s", diff)
	}
}

func TestWatchHealthEnds(t *testing.T) {
	t.Run("ctx cancel returns nil", func(t *testing.T) {
		f := newFixture(t, "dgxa100")
		events, stop := f.watchReady(0)
		f.inject(0, 79) // leaves a probe timer pending
		next(t, events)
		if err := stop(); err != nil {
			t.Errorf("WatchHealth = %v, want nil", err)
		}
		if f.clock.HasWaiters() {
			t.Error("probe timer left on the clock")
		}
	})
	t.Run("Close returns ErrClosed", func(t *testing.T) {
		f := newFixture(t, "dgxa100")
		_, stop := f.watchReady(0)
		if err := f.b.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := stop(); !errors.Is(err, ErrClosed) {
			t.Errorf("WatchHealth = %v, want ErrClosed", err)
		}
		if err := f.b.WatchHealth(context.Background(), nil); !errors.Is(err, ErrClosed) {
			t.Errorf("WatchHealth after Close = %v, want ErrClosed", err)
		}
	})
	t.Run("second watcher refused", func(t *testing.T) {
		f := newFixture(t, "dgxa100")
		f.watchReady(0)
		if err := f.b.WatchHealth(f.ctx, nil); !errors.Is(err, ErrAlreadyWatching) {
			t.Errorf("second WatchHealth = %v, want ErrAlreadyWatching", err)
		}
	})
}

// scriptedLibrary is a Fake whose event sets first answer Wait from script.
type scriptedLibrary struct {
	*Fake
	script []waitResult
}

func (l *scriptedLibrary) EventSetCreate() (nvml.EventSet, nvml.Return) {
	set, ret := l.Fake.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	s := &scriptedEventSet{fakeEventSet: set.(*fakeEventSet)}
	s.script = append(s.script, l.script...)
	return s, nvml.SUCCESS
}

type scriptedEventSet struct {
	*fakeEventSet
	mu     sync.Mutex
	script []waitResult
}

func (s *scriptedEventSet) Wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	s.mu.Lock()
	if len(s.script) > 0 {
		r := s.script[0]
		s.script = s.script[1:]
		s.mu.Unlock()
		return r.data, r.ret
	}
	s.mu.Unlock()
	return s.fakeEventSet.Wait(timeoutMs)
}

func TestUnattributedFaultMarksEveryGPUUntilProbed(t *testing.T) {
	tests := []struct {
		name   string
		result waitResult
		reason string
	}{
		{"wait reports a lost GPU", waitResult{ret: nvml.ERROR_GPU_IS_LOST}, "NVML reports a lost GPU: ERROR_GPU_IS_LOST"},
		{"XID without a device", waitResult{data: nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 79}}, "XID 79: GPU has fallen off the bus (GPU not identified)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "3xL4-24GB")
			lib := &scriptedLibrary{Fake: f.fake, script: []waitResult{tc.result}}
			b, err := Open(Options{Library: lib, CoolDown: testCoolDown, EventWait: 5 * time.Millisecond, Clock: f.clock, Logger: klog.FromContext(f.ctx)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			f.b = b

			events, _ := f.watch()
			var got []vgpu.HealthEvent
			for range 3 {
				got = append(got, next(t, events))
			}
			var want []vgpu.HealthEvent
			for i := range 3 {
				want = append(want, vgpu.HealthEvent{UUID: FakeUUID(testNode, i), Health: vgpu.Unhealthy, Reason: tc.reason})
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("events (-want +got):\n%s", diff)
			}

			// The probes find GPU 2 truly lost and the others fine.
			if err := f.fake.SetLost(2, true); err != nil {
				t.Fatal(err)
			}
			f.clock.Step(testCoolDown)
			got = []vgpu.HealthEvent{next(t, events), next(t, events)}
			sort.Slice(got, func(i, j int) bool { return got[i].UUID < got[j].UUID })
			want = []vgpu.HealthEvent{
				{UUID: FakeUUID(testNode, 0), Health: vgpu.Healthy, Reason: "GPU answers NVML again after " + tc.reason},
				{UUID: FakeUUID(testNode, 1), Health: vgpu.Healthy, Reason: "GPU answers NVML again after " + tc.reason},
			}
			sort.Slice(want, func(i, j int) bool { return want[i].UUID < want[j].UUID })
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("recovery events (-want +got):\n%s", diff)
			}
		})
	}
}

// refusingLibrary is a Fake whose GPU refuseIndex fails event registration
// with ERROR_UNKNOWN while answering everything else.
type refusingLibrary struct {
	*Fake
	refuseIndex int
}

func (l *refusingLibrary) DeviceGetHandleByIndex(index int) (nvml.Device, nvml.Return) {
	dev, ret := l.Fake.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS || index != l.refuseIndex {
		return dev, ret
	}
	return refusingDevice{dev.(*fakeDevice)}, nvml.SUCCESS
}

type refusingDevice struct{ *fakeDevice }

func (refusingDevice) RegisterEvents(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_UNKNOWN }

func TestGPUThatRefusesRegistrationStaysHealthy(t *testing.T) {
	f := newFixture(t, "2xA100-40GB")
	b, err := Open(Options{Library: &refusingLibrary{Fake: f.fake, refuseIndex: 0}, CoolDown: testCoolDown, EventWait: 5 * time.Millisecond, Clock: f.clock, Logger: klog.FromContext(f.ctx)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	f.b = b

	// Discovery handles GPU 0 before it registers GPU 1, and events is
	// buffered: an event for GPU 0 would be waiting by now.
	events, _ := f.watchReady(1)
	noEvent(t, events)
	if f.fake.Watched(0) {
		t.Error("GPU 0 watched although registration failed")
	}
	if diff := cmp.Diff([]vgpu.Health{vgpu.Healthy, vgpu.Healthy}, f.health()); diff != "" {
		t.Errorf("GPUs health (-want +got):\n%s", diff)
	}
	if f.clock.HasWaiters() {
		t.Error("a probe is scheduled for a healthy GPU")
	}
}

func TestXIDFromLostGPUIsAttributedByHandle(t *testing.T) {
	f := newFixture(t, "dgxh200")
	events, _ := f.watchReady(2)
	// The GPU falls off the bus: it stops answering, then XID 79 arrives.
	if err := f.fake.SetLost(2, true); err != nil {
		t.Fatal(err)
	}
	f.inject(2, 79)
	want := vgpu.HealthEvent{UUID: FakeUUID(testNode, 2), Health: vgpu.Unhealthy, Reason: "XID 79: GPU has fallen off the bus (needs a reboot)"}
	if diff := cmp.Diff(want, next(t, events)); diff != "" {
		t.Errorf("event (-want +got):\n%s", diff)
	}
	if got := f.clock.Waiters(); got != 1 {
		t.Errorf("probe timers = %d, want 1 (GPU 2 only)", got)
	}
}

package nvidia

import (
	"context"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpuslice/gpuslice/vgpu"
)

const (
	testNode     = "node-a"
	testCoolDown = 30 * time.Second
	// deadline bounds every wait for a condition; reaching it fails a test.
	deadline = 10 * time.Second
)

// fixture is a Backend over fake GPUs with a fake clock.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	fake  *Fake
	clock *testingclock.FakeClock
	b     *Backend
	// opts are the Options b was opened with.
	opts Options
}

func newFixture(t *testing.T, spec string) *fixture {
	t.Helper()
	return newFixtureWith(t, spec, nil)
}

// newFixtureWith is newFixture with the backend's Options changed by
// mutate (nil: none), before Open.
func newFixtureWith(t *testing.T, spec string, mutate func(*Fake, *Options)) *fixture {
	t.Helper()
	logger, ctx := ktesting.NewTestContext(t)
	fake, err := NewFake(spec, testNode)
	if err != nil {
		t.Fatalf("NewFake(%q): %v", spec, err)
	}
	clk := testingclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	f := &fixture{t: t, ctx: ctx, fake: fake, clock: clk}
	f.opts = Options{Library: fake, CoolDown: testCoolDown, EventWait: 5 * time.Millisecond, Clock: clk, Logger: logger}
	if mutate != nil {
		mutate(fake, &f.opts)
	}
	f.b = f.open(f.opts)
	return f
}

// open opens a Backend with opts, closed when the test ends.
func (f *fixture) open(opts Options) *Backend {
	f.t.Helper()
	b, err := Open(opts)
	if err != nil {
		f.t.Fatalf("Open: %v", err)
	}
	f.t.Cleanup(func() {
		if err := b.Close(); err != nil {
			f.t.Errorf("Close: %v", err)
		}
	})
	return b
}

// restart replaces the backend with a new one, as a restarted plugin
// opens it: over fake GPUs made by newFake (nil: the same ones, as real
// GPUs stay while the plugin restarts), with f.opts changed by mutate
// (nil: none). The old backend is closed; stop its watchers first.
func (f *fixture) restart(newFake func() *Fake, mutate func(*Options)) {
	f.t.Helper()
	if err := f.b.Close(); err != nil {
		f.t.Fatalf("Close: %v", err)
	}
	if newFake != nil {
		f.fake = newFake()
		f.opts.Library = f.fake
	}
	opts := f.opts
	if mutate != nil {
		mutate(&opts)
	}
	f.b = f.open(opts)
}

// watch runs WatchHealth until the returned stop is called or the test ends;
// stop returns WatchHealth's result.
func (f *fixture) watch() (events chan vgpu.HealthEvent, stop func() error) {
	f.t.Helper()
	ctx, cancel := context.WithCancel(f.ctx)
	events = make(chan vgpu.HealthEvent, 64)
	done := make(chan error, 1)
	go func() { done <- f.b.WatchHealth(ctx, events) }()
	var result error
	stopped := false
	stop = func() error {
		if stopped {
			return result
		}
		stopped = true
		cancel()
		select {
		case result = <-done:
		case <-time.After(deadline):
			f.t.Fatalf("WatchHealth did not return within %v of ctx end", deadline)
		}
		return result
	}
	f.t.Cleanup(func() { _ = stop() })
	return events, stop
}

// watchReady runs WatchHealth and waits until it listens on every GPU in
// indexes.
func (f *fixture) watchReady(indexes ...int) (chan vgpu.HealthEvent, func() error) {
	f.t.Helper()
	events, stop := f.watch()
	for _, i := range indexes {
		waitFor(f.t, "GPU watched for XIDs", func() bool { return f.fake.Watched(i) })
	}
	return events, stop
}

func (f *fixture) inject(index int, xid uint64) {
	f.t.Helper()
	if err := f.fake.InjectXID(index, xid); err != nil {
		f.t.Fatalf("InjectXID(%d, %d): %v", index, xid, err)
	}
}

// waitFor polls cond until it holds, failing the test after deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	timeout := time.After(deadline)
	for !cond() {
		select {
		case <-tick.C:
		case <-timeout:
			t.Fatalf("timed out after %v waiting for: %s", deadline, what)
		}
	}
}

// next returns the next health event, failing the test after deadline.
func next(t *testing.T, events <-chan vgpu.HealthEvent) vgpu.HealthEvent {
	t.Helper()
	select {
	case ev := <-events:
		return ev
	case <-time.After(deadline):
		t.Fatalf("no health event within %v", deadline)
		return vgpu.HealthEvent{}
	}
}

// noEvent fails the test if an event is already waiting.
func noEvent(t *testing.T, events <-chan vgpu.HealthEvent) {
	t.Helper()
	select {
	case ev := <-events:
		t.Fatalf("unexpected health event %+v", ev)
	default:
	}
}

// health returns the health GPUs reports for each GPU.
func (f *fixture) health() []vgpu.Health {
	f.t.Helper()
	gpus, err := f.b.GPUs()
	if err != nil {
		f.t.Fatalf("GPUs: %v", err)
	}
	out := make([]vgpu.Health, len(gpus))
	for i, g := range gpus {
		out[i] = g.Health
	}
	return out
}

// healthAll returns n copies of h, with the listed indexes set to other.
func healthAll(n int, h vgpu.Health, other vgpu.Health, indexes ...int) []vgpu.Health {
	out := make([]vgpu.Health, n)
	for i := range out {
		out[i] = h
	}
	for _, i := range indexes {
		out[i] = other
	}
	return out
}

package nvidia

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
)

// TestActivity reads memory in use, utilisation and processes of fake GPUs
// through the Backend's NVML calls; a lost GPU is left out.
func TestActivity(t *testing.T) {
	f := newFixture(t, "3xA100-80GB")
	if err := f.fake.SetProcesses(0, FakeProcess{PID: 4242, MemoryMiB: 10240}, FakeProcess{PID: 4343, MemoryMiB: 2048}); err != nil {
		t.Fatal(err)
	}
	if err := f.fake.SetUtilization(0, 73); err != nil {
		t.Fatal(err)
	}
	if err := f.fake.SetLost(2, true); err != nil {
		t.Fatal(err)
	}
	got, err := f.b.Activity()
	if err != nil {
		t.Fatal(err)
	}
	want := []vgpu.GPUActivity{
		{UUID: FakeUUID(testNode, 0), MemoryUsedMiB: 12288, UtilizationPercent: 73, Processes: []vgpu.ProcessUsage{{PID: 4242, MemoryMiB: 10240}, {PID: 4343, MemoryMiB: 2048}}},
		{UUID: FakeUUID(testNode, 1)},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Activity (-want +got):\n%s", diff)
	}
	for _, bad := range []func() error{
		func() error { return f.fake.SetProcesses(0, FakeProcess{PID: 0, MemoryMiB: 1}) },
		func() error { return f.fake.SetUtilization(0, 101) },
		func() error { return f.fake.SetProcesses(9) },
	} {
		if bad() == nil {
			t.Error("a bad fake activity was accepted")
		}
	}
}

// TestXIDCounts counts every XID the watch sees, application faults too.
func TestXIDCounts(t *testing.T) {
	f := newFixture(t, "2xA100-80GB")
	events, _ := f.watchReady(0, 1)
	f.inject(0, 13)
	f.inject(0, 13)
	f.inject(1, 79)
	next(t, events) // XID 79 turns GPU 1 unhealthy; the XIDs before it were handled
	want := map[string]map[uint64]uint64{FakeUUID(testNode, 0): {13: 2}, FakeUUID(testNode, 1): {79: 1}}
	if diff := cmp.Diff(want, f.b.XIDCounts()); diff != "" {
		t.Errorf("XIDCounts (-want +got):\n%s", diff)
	}
}

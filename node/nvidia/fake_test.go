package nvidia

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
)

func TestFakeLostGPU(t *testing.T) {
	f, err := NewFake("2xT4-16GB", testNode)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetLost(1, true); err != nil {
		t.Fatal(err)
	}
	dev0, _ := f.DeviceGetHandleByIndex(0)
	dev1 := f.devices[1]

	calls := []struct {
		name string
		call func() nvml.Return
		want nvml.Return
	}{
		{"handle by index", func() nvml.Return { _, r := f.DeviceGetHandleByIndex(1); return r }, nvml.ERROR_GPU_IS_LOST},
		{"handle by index out of range", func() nvml.Return { _, r := f.DeviceGetHandleByIndex(2); return r }, nvml.ERROR_INVALID_ARGUMENT},
		{"handle by UUID", func() nvml.Return { _, r := f.DeviceGetHandleByUUID(FakeUUID(testNode, 1)); return r }, nvml.ERROR_GPU_IS_LOST},
		{"handle by unknown UUID", func() nvml.Return { _, r := f.DeviceGetHandleByUUID("GPU-x"); return r }, nvml.ERROR_NOT_FOUND},
		{"handle by bus ID", func() nvml.Return { _, r := f.DeviceGetHandleByPciBusId("00000000:02:00.0"); return r }, nvml.ERROR_GPU_IS_LOST},
		{"handle by healthy bus ID", func() nvml.Return { _, r := f.DeviceGetHandleByPciBusId("00000000:01:00.0"); return r }, nvml.SUCCESS},
		{"handle by unknown bus ID", func() nvml.Return { _, r := f.DeviceGetHandleByPciBusId("00000000:09:00.0"); return r }, nvml.ERROR_NOT_FOUND},
		{"UUID", func() nvml.Return { _, r := dev1.GetUUID(); return r }, nvml.ERROR_GPU_IS_LOST},
		{"index", func() nvml.Return { _, r := dev1.GetIndex(); return r }, nvml.ERROR_GPU_IS_LOST},
		{"healthy index", func() nvml.Return { _, r := dev0.GetIndex(); return r }, nvml.SUCCESS},
		{"minor", func() nvml.Return { _, r := dev1.GetMinorNumber(); return r }, nvml.ERROR_GPU_IS_LOST},
		{"name", func() nvml.Return { _, r := dev1.GetName(); return r }, nvml.ERROR_GPU_IS_LOST},
		{"memory", func() nvml.Return { _, r := dev1.GetMemoryInfo(); return r }, nvml.ERROR_GPU_IS_LOST},
		{"PCI", func() nvml.Return { _, r := dev1.GetPciInfo(); return r }, nvml.ERROR_GPU_IS_LOST},
		{"NUMA", func() nvml.Return { _, r := dev1.GetNumaNodeId(); return r }, nvml.ERROR_GPU_IS_LOST},
		{"event types", func() nvml.Return { _, r := dev1.GetSupportedEventTypes(); return r }, nvml.ERROR_GPU_IS_LOST},
	}
	for _, tc := range calls {
		if got := tc.call(); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
		}
	}

	for _, err := range []error{f.SetLost(2, true), f.SetLost(-1, false), f.InjectXID(2, 79), f.SetEventsUnsupported(5, true)} {
		if err == nil {
			t.Error("a call with an index out of range succeeded")
		}
	}
}

func TestFakeEventSet(t *testing.T) {
	f, err := NewFake("1xA10-24GB", testNode)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewFake("1xA10-24GB", "node-b")
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := f.DeviceGetHandleByIndex(0)
	set, _ := f.EventSetCreate()
	foreign, _ := other.EventSetCreate()

	if got := dev.RegisterEvents(nvml.EventTypeXidCriticalError, foreign); got != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("register on another fake's set = %v, want ERROR_INVALID_ARGUMENT", got)
	}
	if got := dev.RegisterEvents(nvml.EventTypePState, set); got != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("register unsupported type = %v, want ERROR_NOT_SUPPORTED", got)
	}
	if err := f.InjectXID(0, 13); !errors.Is(err, ErrNotWatched) {
		t.Errorf("InjectXID before registration = %v, want ErrNotWatched", err)
	}
	if got := dev.RegisterEvents(nvml.EventTypeXidCriticalError, set); got != nvml.SUCCESS {
		t.Fatalf("register = %v", got)
	}
	if _, got := set.Wait(0); got != nvml.ERROR_TIMEOUT {
		t.Errorf("Wait on an empty set = %v, want ERROR_TIMEOUT", got)
	}
	if err := f.InjectXID(0, 13); err != nil {
		t.Fatal(err)
	}
	data, ret := set.Wait(0)
	want := nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: 13, GpuInstanceId: noInstance, ComputeInstanceId: noInstance}
	if ret != nvml.SUCCESS || data != want {
		t.Errorf("Wait = %+v, %v; want %+v, SUCCESS", data, ret, want)
	}

	for range 2 {
		if got := set.Free(); got != nvml.SUCCESS {
			t.Errorf("Free = %v", got)
		}
	}
	if _, got := set.Wait(1000); got != nvml.ERROR_UNINITIALIZED {
		t.Errorf("Wait after Free = %v, want ERROR_UNINITIALIZED", got)
	}
	if got := dev.RegisterEvents(nvml.EventTypeXidCriticalError, set); got != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("register on a freed set = %v, want ERROR_INVALID_ARGUMENT", got)
	}
	if diff := cmp.Diff(false, f.Watched(0)); diff != "" {
		t.Errorf("Watched after Free (-want +got):\n%s", diff)
	}
}

// TestFakeKeepStateIn: recovery actions kept in a folder reach a new Fake
// only for the same GPUs (index and UUID); a damaged file is an error
// naming it.
func TestFakeKeepStateIn(t *testing.T) {
	dir := t.TempDir()
	f, err := NewFake("2xA100-80GB", testNode)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.KeepStateIn(dir); err != nil {
		t.Fatal(err)
	}
	if err := f.InjectXID(1, 79); !errors.Is(err, ErrNotWatched) {
		t.Fatalf("InjectXID = %v, want ErrNotWatched", err)
	}
	actions := func(node string) []nvml.DeviceGpuRecoveryAction {
		t.Helper()
		g, err := NewFake("2xA100-80GB", node)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.KeepStateIn(dir); err != nil {
			t.Fatal(err)
		}
		return []nvml.DeviceGpuRecoveryAction{g.RecoveryAction(0), g.RecoveryAction(1)}
	}
	none, reboot := nvml.GPU_RECOVERY_ACTION_NONE, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT
	if diff := cmp.Diff([]nvml.DeviceGpuRecoveryAction{none, reboot}, actions(testNode)); diff != "" {
		t.Errorf("actions of the same GPUs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]nvml.DeviceGpuRecoveryAction{none, none}, actions("node-b")); diff != "" {
		t.Errorf("actions of other GPUs (-want +got):\n%s", diff)
	}
	if err := f.ResetGPU(1); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]nvml.DeviceGpuRecoveryAction{none, none}, actions(testNode)); diff != "" {
		t.Errorf("actions after the reset (-want +got):\n%s", diff)
	}

	if err := os.WriteFile(filepath.Join(dir, FakeStateFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.KeepStateIn(dir); err == nil || !strings.Contains(err.Error(), FakeStateFile) {
		t.Errorf("KeepStateIn on a damaged file = %v, want an error naming %s", err, FakeStateFile)
	}
}

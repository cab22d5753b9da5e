package nvidia

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// FakeProcess is a compute process on a fake GPU, as NVML lists it.
type FakeProcess struct {
	// PID is the process ID in the host's PID namespace.
	PID int `json:"pid"`
	// MemoryMiB is the GPU memory the process holds.
	MemoryMiB int64 `json:"memoryMiB"`
}

// FakeActivity is what runs on a fake GPU at one moment, as a fault file
// sets it (FakeFault.Activity): its compute processes and utilisation.
type FakeActivity struct {
	// Processes replace the GPU's compute processes; none leaves it idle.
	Processes []FakeProcess `json:"processes,omitempty"`
	// UtilizationPercent is the utilisation NVML reports, 0 to 100.
	UtilizationPercent int `json:"utilizationPercent,omitempty"`
}

// fakeActivity is what runs on one fake GPU.
type fakeActivity struct {
	procs           []FakeProcess
	utilizationPcnt uint32
}

// SetProcesses replaces the compute processes on the GPU at index. The
// GPU's memory in use becomes their sum (capped at its total), as NVML
// reports it. It returns an error for an index out of range or a negative
// memory figure.
func (f *Fake) SetProcesses(index int, procs ...FakeProcess) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkIndex(index); err != nil {
		return err
	}
	for _, p := range procs {
		if p.PID <= 0 || p.MemoryMiB < 0 {
			return fmt.Errorf("fake GPU %d: process %+v: PID must be above 0 and memory at least 0", index, p)
		}
	}
	a := f.activityLocked(index)
	a.procs = append([]FakeProcess(nil), procs...)
	f.activity[index] = a
	return nil
}

// SetActivity replaces what runs on the GPU at index: SetProcesses and
// SetUtilization at once. It returns their errors; on an error nothing
// changes.
func (f *Fake) SetActivity(index int, a FakeActivity) error {
	if a.UtilizationPercent < 0 || a.UtilizationPercent > 100 {
		return fmt.Errorf("fake GPU %d: utilisation %d: must be 0 to 100", index, a.UtilizationPercent)
	}
	if err := f.SetProcesses(index, a.Processes...); err != nil {
		return err
	}
	return f.SetUtilization(index, a.UtilizationPercent)
}

// SetUtilization sets the utilisation NVML reports for the GPU at index,
// 0 to 100 percent.
func (f *Fake) SetUtilization(index, percent int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkIndex(index); err != nil {
		return err
	}
	if percent < 0 || percent > 100 {
		return fmt.Errorf("fake GPU %d: utilisation %d: must be 0 to 100", index, percent)
	}
	a := f.activityLocked(index)
	a.utilizationPcnt = uint32(percent) //nolint:gosec // G115: checked above.
	f.activity[index] = a
	return nil
}

// activityLocked returns the GPU's activity; f.mu must be held.
func (f *Fake) activityLocked(index int) fakeActivity {
	if f.activity == nil {
		f.activity = map[int]fakeActivity{}
	}
	return f.activity[index]
}

// usedBytes is the memory the GPU's processes hold, at most total.
func (f *Fake) usedBytes(index int, total uint64) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var used uint64
	for _, p := range f.activity[index].procs {
		used += uint64(p.MemoryMiB) * bytesPerMiB //nolint:gosec // G115: not negative (SetProcesses).
	}
	return min(used, total)
}

func (d *fakeDevice) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	if d.lost() {
		return nvml.Utilization{}, nvml.ERROR_GPU_IS_LOST
	}
	d.fake.mu.Lock()
	defer d.fake.mu.Unlock()
	return nvml.Utilization{Gpu: d.fake.activity[d.index].utilizationPcnt}, nvml.SUCCESS
}

func (d *fakeDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	if d.lost() {
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	d.fake.mu.Lock()
	defer d.fake.mu.Unlock()
	var out []nvml.ProcessInfo
	for _, p := range d.fake.activity[d.index].procs {
		out = append(out, nvml.ProcessInfo{
			Pid:               uint32(p.PID),                     //nolint:gosec // G115: PIDs fit uint32.
			UsedGpuMemory:     uint64(p.MemoryMiB) * bytesPerMiB, //nolint:gosec // G115: not negative.
			GpuInstanceId:     noInstance,
			ComputeInstanceId: noInstance,
		})
	}
	return out, nvml.SUCCESS
}

package nvidia

import (
	"fmt"
	"maps"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Activity reads, for every GPU that answers NVML, the memory in use, the
// utilisation and the compute processes with their memory. A GPU that
// does not answer (lost, or faulty) is left out; Activity fails only when
// NVML cannot count the GPUs or the Backend is closed. It may be called
// from any goroutine, while WatchHealth runs.
func (b *Backend) Activity() ([]vgpu.GPUActivity, error) {
	b.life.RLock()
	defer b.life.RUnlock()
	n, err := b.openCount()
	if err != nil {
		return nil, err
	}
	out := make([]vgpu.GPUActivity, 0, n)
	for i := range n {
		a, err := b.readActivity(i)
		if err != nil {
			b.logger.V(4).Info("No activity for a GPU", "index", i, "err", err)
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

// readActivity reads the activity of the GPU at NVML index i.
func (b *Backend) readActivity(i int) (vgpu.GPUActivity, error) {
	fail := func(what string, ret nvml.Return) (vgpu.GPUActivity, error) {
		return vgpu.GPUActivity{}, fmt.Errorf("GPU %d: NVML %s: %w", i, what, ret)
	}
	dev, uuid, err := b.deviceAt(i)
	if err != nil {
		return vgpu.GPUActivity{}, err
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("memory info", ret)
	}
	a := vgpu.GPUActivity{UUID: uuid, MemoryUsedMiB: int64(mem.Used / bytesPerMiB)} //nolint:gosec // G115: GPU memory in MiB fits int64.
	if rates, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		a.UtilizationPercent = int(rates.Gpu)
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return fail("compute processes", ret)
	}
	for _, p := range procs {
		a.Processes = append(a.Processes, vgpu.ProcessUsage{PID: int(p.Pid), MemoryMiB: int64(p.UsedGpuMemory / bytesPerMiB)}) //nolint:gosec // G115: as above.
	}
	return a, nil
}

// XIDCounts returns how many XIDs the health watch has seen on each GPU
// since Open, by GPU UUID and XID, application faults included. XIDs NVML
// did not attribute to a GPU are not counted. The result is a copy.
func (b *Backend) XIDCounts() map[string]map[uint64]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]map[uint64]uint64, len(b.xids))
	for uuid, byXID := range b.xids {
		out[uuid] = maps.Clone(byXID)
	}
	return out
}

// countXID records one XID on the GPU uuid.
func (b *Backend) countXID(uuid string, xid uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.xids[uuid] == nil {
		b.xids[uuid] = map[uint64]uint64{}
	}
	b.xids[uuid][xid]++
}

package nvidia

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/vgpu"
)

// bytesPerMiB converts NVML's memory figures (bytes) to MiB.
const bytesPerMiB = 1 << 20

// GPUs reads the node's physical GPUs from NVML, in NVML index order, each
// with the health the backend currently holds for it. SchedulableMemoryMiB
// is left 0 (the plugin computes it), CoresPercent is 100 and NUMANode is -1
// when NVML cannot tell.
//
// A GPU that does not answer makes GPUs fail with an error naming its index
// and NVML's error, unless it is already unhealthy and an earlier call read
// it: then its last record is returned, marked Unhealthy, so that one broken
// GPU does not hide the others. Safe for concurrent use; returns ErrClosed
// after Close.
func (b *Backend) GPUs() ([]vgpu.GPU, error) {
	b.life.RLock()
	defer b.life.RUnlock()
	n, err := b.openCount()
	if err != nil {
		return nil, err
	}
	gpus := make([]vgpu.GPU, 0, n)
	for i := range n {
		gpu, err := b.readGPU(i)

		b.mu.Lock()
		if err != nil {
			last, seen := b.known[i]
			if _, faulty := b.faults[last.UUID]; !seen || !faulty {
				b.mu.Unlock()
				return nil, err
			}
			b.logger.V(2).Info("GPU does not answer; reporting its last record", "index", i, "gpu", last.UUID, "err", err)
			gpu = last
		} else {
			b.known[i] = gpu
		}
		gpu.Health = vgpu.Healthy
		if _, faulty := b.faults[gpu.UUID]; faulty {
			gpu.Health = vgpu.Unhealthy
		}
		b.mu.Unlock()

		gpus = append(gpus, gpu)
	}
	return gpus, nil
}

// deviceAt returns the handle and UUID of the GPU at NVML index i.
func (b *Backend) deviceAt(i int) (nvml.Device, string, error) {
	dev, ret := b.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("GPU %d: NVML get handle: %w", i, ret)
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("GPU %d: NVML get UUID: %w", i, ret)
	}
	return dev, uuid, nil
}

// readGPU reads the static facts of the GPU at NVML index i. Health is left
// for the caller.
func (b *Backend) readGPU(i int) (vgpu.GPU, error) {
	fail := func(what string, ret nvml.Return) (vgpu.GPU, error) {
		return vgpu.GPU{}, fmt.Errorf("GPU %d: NVML %s: %w", i, what, ret)
	}
	dev, uuid, err := b.deviceAt(i)
	if err != nil {
		return vgpu.GPU{}, err
	}
	minor, ret := dev.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return fail("get minor number", ret)
	}
	name, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		return fail("get name", ret)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("get memory info", ret)
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return fail("get PCI info", ret)
	}
	return vgpu.GPU{
		UUID:           uuid,
		Index:          i,
		Minor:          minor,
		Model:          name,
		TotalMemoryMiB: int64(mem.Total / bytesPerMiB), //nolint:gosec // G115: bytes/2^20 fits int64
		CoresPercent:   100,
		NUMANode:       b.numaNode(dev),
		PCIBusID:       cString(pci.BusId[:]),
	}, nil
}

// numaNode is the GPU's NUMA node, or -1 when the driver is too old to
// export nvmlDeviceGetNumaNodeId or the call fails (ERROR_NOT_SUPPORTED on
// single-node machines and some platforms).
func (b *Backend) numaNode(dev nvml.Device) int {
	if !b.hasNUMA {
		return -1
	}
	node, ret := dev.GetNumaNodeId()
	if ret != nvml.SUCCESS || node < 0 {
		return -1
	}
	return node
}

// cString converts a NUL-terminated C char array to a Go string.
func cString(chars []int8) string {
	buf := make([]byte, 0, len(chars))
	for _, c := range chars {
		if c == 0 {
			break
		}
		buf = append(buf, byte(c)) //nolint:gosec // G115: C char bytes, reinterpreted on purpose
	}
	return string(buf)
}

// DriverVersion returns the NVIDIA driver's version as NVML reports it,
// e.g. "615.20.01". Safe for concurrent use; returns ErrClosed after
// Close.
func (b *Backend) DriverVersion() (string, error) {
	b.life.RLock()
	defer b.life.RUnlock()
	if b.closed {
		return "", ErrClosed
	}
	v, ret := b.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("NVML driver version: %w", ret)
	}
	return v, nil
}

// openCount returns how many GPUs NVML counts, or ErrClosed after Close.
// Callers hold b.life's read lock.
func (b *Backend) openCount() (int, error) {
	if b.closed {
		return 0, ErrClosed
	}
	n, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("NVML device count: %w", ret)
	}
	return n, nil
}

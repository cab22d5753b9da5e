package vgpu

// Health is the state of one physical GPU as the node agent sees it.
type Health string

const (
	// Healthy means NVML answers normally and no device fault is pending.
	Healthy Health = "Healthy"
	// Unhealthy means a device fault (an XID that needs a reset) was seen and
	// the GPU has not yet answered a re-probe.
	Unhealthy Health = "Unhealthy"
)

// GPU is one physical GPU of a node. Memory figures are MiB. A zero value is
// not a valid GPU: UUID and TotalMemoryMiB are always set by the backend.
type GPU struct {
	// UUID is NVML's identifier ("GPU-…"); with fake GPUs it is derived from
	// the node name and index so that restarts keep it.
	UUID string `json:"uuid"`
	// Index is NVML's device index on the node (0-based).
	Index int `json:"index"`
	// Minor is the /dev/nvidiaN minor number.
	Minor int `json:"minor"`
	// Model is the product name NVML reports, e.g. "NVIDIA A100-SXM4-80GB".
	Model string `json:"model"`
	// TotalMemoryMiB is the framebuffer size NVML reports.
	TotalMemoryMiB int64 `json:"totalMemoryMiB"`
	// SchedulableMemoryMiB is what slices may use: total minus the driver
	// reserve, times the memory scaling factor. The device plugin fills it.
	SchedulableMemoryMiB int64 `json:"schedulableMemoryMiB"`
	// CoresPercent is the compute the GPU offers to slices; 100 is all of it.
	CoresPercent int `json:"coresPercent"`
	// NUMANode is the GPU's NUMA node, or -1 when unknown.
	NUMANode int `json:"numaNode"`
	// PCIBusID is NVML's bus ID, e.g. "00000000:07:00.0".
	PCIBusID string `json:"pciBusID"`
	// Health is the last health the node agent observed.
	Health Health `json:"health"`
}

// HealthEvent reports that a GPU's health changed. Backends send one per
// change; Reason says why in words a user can act on (e.g. "XID 79: GPU has
// fallen off the bus").
type HealthEvent struct {
	UUID   string
	Health Health
	Reason string
}

// GPUActivity is what a GPU's driver reports in use at one moment: the node
// agent reads it at each metrics scrape.
type GPUActivity struct {
	// UUID names the GPU (GPU.UUID).
	UUID string
	// MemoryUsedMiB is the GPU memory in use, by every process and the
	// driver, in MiB.
	MemoryUsedMiB int64
	// UtilizationPercent is the share of the driver's last sample period
	// (1/6 s to 1 s) in which a kernel ran on the GPU, 0 to 100.
	UtilizationPercent int
	// Processes are the compute processes on the GPU with the memory each
	// holds there; empty when none runs.
	Processes []ProcessUsage
}

// ProcessUsage is one process's use of one GPU.
type ProcessUsage struct {
	// PID is the process ID in the host's PID namespace, as the driver
	// reports it.
	PID int
	// MemoryMiB is the GPU memory the process holds, in MiB.
	MemoryMiB int64
}

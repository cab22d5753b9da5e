package handoff

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// The environment a GPU container gets, in both modes. The CUDA_* names are
// HAMi-core's (libvgpu.so reads them), so its enforcement library works
// unchanged; the GPUSLICE_* names tell the container who it is and what it
// holds.
const (
	// EnvVisibleDevices lists the container's GPU UUIDs, comma-joined, in
	// the allocation's order; the NVIDIA container runtime reads it.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// EnvMemoryLimitPrefix + i is the memory limit of the i-th visible GPU,
	// in MiB with an "m" suffix (e.g. "10240m").
	EnvMemoryLimitPrefix = "CUDA_DEVICE_MEMORY_LIMIT_"
	// EnvSMLimit is the compute limit in percent. HAMi-core reads one value
	// for all GPUs; it is the first slice's CoresPercent and is set only
	// when that is above 0.
	EnvSMLimit = "CUDA_DEVICE_SM_LIMIT"
	// EnvSharedCache is the path, inside the container, of HAMi-core's
	// per-container memory-accounting file.
	EnvSharedCache = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
	// EnvPod is the pod as <namespace>/<name>.
	EnvPod = "GPUSLICE_POD"
	// EnvPodUID is the pod's UID.
	EnvPodUID = "GPUSLICE_POD_UID"
	// EnvContainer is the container's name.
	EnvContainer = "GPUSLICE_CONTAINER"
	// EnvAllocation is the container's slices as compact JSON:
	// [{"uuid":"GPU-…","memoryMiB":10240,"coresPercent":30}, …].
	EnvAllocation = "GPUSLICE_ALLOCATION"

	// LibVGPUContainerPath is where HAMi-core's library is mounted under
	// the hami-core mechanism (Config.HostLibVGPU).
	LibVGPUContainerPath = "/usr/local/vgpu/libvgpu.so"
	// PreloadContainerPath is where the plugin's ld.so.preload file is
	// mounted under the hami-core mechanism; it names LibVGPUContainerPath.
	PreloadContainerPath = "/etc/ld.so.preload"
	// PreloadFileName is the ld.so.preload file in Config's state folder.
	PreloadFileName = "ld.so.preload"
)

// EnvVar is one environment variable; order matters for stable output.
type EnvVar struct {
	Name, Value string
}

// HostMount is a bind mount of a host file or folder into the container,
// read-only unless Writable.
type HostMount struct {
	HostPath, ContainerPath string
	Writable                bool
}

// Edits is everything a container gets for its slice: written to
// a CDI spec (mode cdi) or returned from Allocate (mode env).
type Edits struct {
	Env    []EnvVar
	Mounts []HostMount
	// DeviceNodes are device paths, the same on the host and in the
	// container; none with fake GPUs, or when the NVIDIA CDI devices
	// bring them.
	DeviceNodes []string
	// Guarded says the node's enforcement mechanism holds the container
	// to its slice.
	Guarded bool
}

// allocationJSON is the wire form of one slice in EnvAllocation; the field
// names are those of the hami.io/gpu-allocation annotation.
type allocationJSON struct {
	UUID         string `json:"uuid"`
	MemoryMiB    int64  `json:"memoryMiB"`
	CoresPercent int    `json:"coresPercent"`
}

// Builder builds what a container gets for its slice on one node, the same
// in every mode of the node agent (device plugin, DRA driver). It is a
// value of settings; EditsFor is safe for concurrent use when GPU is.
type Builder struct {
	// NodeName names the node in errors.
	NodeName string
	// GPU returns the node's GPU with a UUID, false for one the node does
	// not advertise.
	GPU func(uuid string) (vgpu.GPU, bool)
	// SharedCacheDir is the container folder of HAMi-core's accounting
	// files (EnvSharedCache).
	SharedCacheDir string
	// FakeGPUs leaves the device nodes out: fake GPUs have no /dev files.
	FakeGPUs bool
	// Enforcement is the node's mechanism; HostLibVGPU, StateDir and
	// MPSDir are the host paths it mounts from.
	Enforcement vgpu.Enforcement
	HostLibVGPU string
	StateDir    string
	MPSDir      string
	// NVIDIACDI are the NVIDIA toolkit's CDI devices by GPU UUID
	// (NVIDIACDIDevices); used under the driver mechanism only.
	NVIDIACDI map[string]string
}

// Owner is who a slice's edits are for: the environment names it and
// HAMi-core's accounting file is keyed by it.
type Owner struct {
	// Namespace, Pod and PodUID name the pod; in DRA mode the pod the claim
	// is reserved for (empty when several share it).
	Namespace, Pod string
	PodUID         string
	// Container is the container's name; empty in DRA mode, where one CDI
	// device serves every container that references the claim.
	Container string
	// CacheKey names the accounting file (<CacheKey>.cache): the pod UID
	// and container name in device-plugin mode, the claim UID and request
	// in DRA mode.
	CacheKey string
}

// EditsFor builds the container edits of container ca of pod: the common
// environment, then what the node's enforcement mechanism adds
// (enforcementEdits). Every slice must name a GPU this node advertises;
// the error says which does not. Device nodes are left out with fake GPUs,
// whose /dev files do not exist, and when the NVIDIA CDI devices bring
// them.
func (a *Builder) EditsFor(pod *corev1.Pod, ca vgpu.ContainerAllocation) (Edits, error) {
	return a.EditsForOwner(Owner{
		Namespace: pod.Namespace, Pod: pod.Name, PodUID: string(pod.UID), Container: ca.Name,
		CacheKey: string(pod.UID) + "-" + ca.Name,
	}, ca)
}

// EditsForOwner is EditsFor for any owner; EnvPod and EnvPodUID are left
// out when owner names no pod, EnvContainer when it names no container.
// ca.Name appears only in errors.
func (a *Builder) EditsForOwner(owner Owner, ca vgpu.ContainerAllocation) (Edits, error) {
	var e Edits
	uuids := make([]string, 0, len(ca.GPUs))
	slices := make([]allocationJSON, 0, len(ca.GPUs))
	gpus := make([]vgpu.GPU, 0, len(ca.GPUs))
	for _, s := range ca.GPUs {
		g, ok := a.GPU(s.UUID)
		if !ok {
			return Edits{}, fmt.Errorf("container %q: the allocation names GPU %s, which node %s does not advertise", ca.Name, s.UUID, a.NodeName)
		}
		uuids = append(uuids, s.UUID)
		gpus = append(gpus, g)
		slices = append(slices, allocationJSON{UUID: s.UUID, MemoryMiB: s.MemoryMiB, CoresPercent: s.CoresPercent})
	}
	allocation, err := json.Marshal(slices)
	if err != nil {
		return Edits{}, fmt.Errorf("encode %s: %w", EnvAllocation, err)
	}

	e.Env = append(e.Env, EnvVar{EnvVisibleDevices, strings.Join(uuids, ",")})
	for i, s := range ca.GPUs {
		e.Env = append(e.Env, EnvVar{EnvMemoryLimitPrefix + strconv.Itoa(i), strconv.FormatInt(s.MemoryMiB, 10) + "m"})
	}
	if len(ca.GPUs) > 0 && ca.GPUs[0].CoresPercent > 0 {
		e.Env = append(e.Env, EnvVar{EnvSMLimit, strconv.Itoa(ca.GPUs[0].CoresPercent)})
	}
	e.Env = append(e.Env, EnvVar{EnvSharedCache, path.Join(a.SharedCacheDir, owner.CacheKey+".cache")})
	if owner.Pod != "" {
		e.Env = append(e.Env, EnvVar{EnvPod, owner.Namespace + "/" + owner.Pod}, EnvVar{EnvPodUID, owner.PodUID})
	}
	if owner.Container != "" {
		e.Env = append(e.Env, EnvVar{EnvContainer, owner.Container})
	}
	e.Env = append(e.Env, EnvVar{EnvAllocation, string(allocation)})

	e.Guarded = a.enforcementEdits(&e, ca, gpus)
	if !a.FakeGPUs && a.NVIDIADevicesFor(uuids) == nil {
		for _, g := range gpus {
			e.DeviceNodes = append(e.DeviceNodes, "/dev/nvidia"+strconv.Itoa(g.Minor))
		}
		// The control nodes every CUDA process needs besides its GPUs.
		e.DeviceNodes = append(e.DeviceNodes, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
	}
	return e, nil
}

// PreloadContent is the ld.so.preload file the plugin mounts into GPU
// containers when HostLibVGPU is set.
const PreloadContent = LibVGPUContainerPath + "\n"

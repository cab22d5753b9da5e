package vgpu

import (
	"errors"
	"fmt"
)

// PodAllocation is what a pod was granted: the node and, per container that
// asked for GPUs, the slices it holds. The scheduler extender decides it at
// bind time and publishes it on the Pod (AnnotationPodAllocation); the device
// plugin reads it to set each container's limits.
type PodAllocation struct {
	// Node is the name of the Node the pod is bound to; never empty.
	Node string
	// Containers has one entry per container with a ContainerRequest, in
	// the same order; never empty.
	Containers []ContainerAllocation
}

// ContainerAllocation is the slices one container holds.
type ContainerAllocation struct {
	// Name is the container's name, unique within the pod.
	Name string
	// Init is true for an init container (sidecar or not).
	Init bool
	// GPUs holds one slice per granted GPU, each on a different GPU; never
	// empty.
	GPUs []GPUSlice
}

// GPUSlice is a share of one physical GPU.
type GPUSlice struct {
	// UUID names the GPU (GPU.UUID); never empty.
	UUID string
	// MemoryMiB is the memory limit of the slice, above 0. Percentages are
	// resolved against the GPU's SchedulableMemoryMiB before this is set.
	MemoryMiB int64
	// CoresPercent is the compute reserved and enforced on the GPU, 0 to
	// 100. 0 means none is reserved and the slice is not throttled; 100
	// with Exclusive requests means the whole GPU.
	CoresPercent int
}

// Container returns the allocation of the container with this name, and false
// when a has none.
func (a PodAllocation) Container(name string) (ContainerAllocation, bool) {
	for _, c := range a.Containers {
		if c.Name == name {
			return c, true
		}
	}
	return ContainerAllocation{}, false
}

// Validate reports every way a breaks the rules stated on its fields: empty
// node, no containers, empty or repeated container name, no slices, more
// than MaxGPUsPerContainer slices in a container, empty UUID, the same GPU
// twice in one container, MemoryMiB not above 0, CoresPercent outside
// 0..100. Errors name the field path (e.g. "containers[0].gpus[1].uuid")
// and the value. More than MaxGPUContainersPerPod containers is reported
// alone, before the containers are read. The extender calls it before
// publishing; ParsePodAllocation calls it after decoding.
func (a PodAllocation) Validate() error {
	if err := tooManyContainers(len(a.Containers)); err != nil {
		return err
	}
	var errs []error
	if a.Node == "" {
		errs = append(errs, errors.New("node: must not be empty"))
	}
	if len(a.Containers) == 0 {
		errs = append(errs, errors.New("containers: must not be empty"))
	}
	names := make(map[string]int, len(a.Containers))
	for i, c := range a.Containers {
		path := fmt.Sprintf("containers[%d]", i)
		if c.Name == "" {
			errs = append(errs, fmt.Errorf("%s.name: must not be empty", path))
		} else if j, dup := names[c.Name]; dup {
			errs = append(errs, fmt.Errorf("%s.name=%q: already used by containers[%d]", path, c.Name, j))
		} else {
			names[c.Name] = i
		}
		switch {
		case len(c.GPUs) == 0:
			errs = append(errs, fmt.Errorf("%s.gpus: must not be empty", path))
		case len(c.GPUs) > MaxGPUsPerContainer:
			errs = append(errs, tooManySlices(i, len(c.GPUs)))
			continue
		}
		uuids := make(map[string]int, len(c.GPUs))
		for k, s := range c.GPUs {
			spath := fmt.Sprintf("%s.gpus[%d]", path, k)
			if s.UUID == "" {
				errs = append(errs, fmt.Errorf("%s.uuid: must not be empty", spath))
			} else if j, dup := uuids[s.UUID]; dup {
				errs = append(errs, fmt.Errorf("%s.uuid=%q: already used by %s.gpus[%d]: a container's slices must be on different GPUs", spath, s.UUID, path, j))
			} else {
				uuids[s.UUID] = k
			}
			if s.MemoryMiB <= 0 {
				errs = append(errs, fmt.Errorf("%s.memoryMiB=%d: must be above 0", spath, s.MemoryMiB))
			}
			if s.CoresPercent < 0 || s.CoresPercent > MaxPercent {
				errs = append(errs, fmt.Errorf("%s.coresPercent=%d: must be from 0 to %d", spath, s.CoresPercent, MaxPercent))
			}
		}
	}
	return errors.Join(errs...)
}

// tooManyContainers is the error of an allocation of n containers, or nil
// when n is at most MaxGPUContainersPerPod.
func tooManyContainers(n int) error {
	if n <= MaxGPUContainersPerPod {
		return nil
	}
	return fmt.Errorf("containers: %d entries: must be at most %d", n, MaxGPUContainersPerPod)
}

// tooManySlices is the error of container i's n slices, over
// MaxGPUsPerContainer.
func tooManySlices(i, n int) error {
	return fmt.Errorf("containers[%d].gpus: %d slices: must be at most %d, one per GPU", i, n, MaxGPUsPerContainer)
}

package vgputest

import "github.com/gpuslice/gpuslice/vgpu"

// AllocationBuilder builds a vgpu.PodAllocation. Start with Allocation.
type AllocationBuilder struct {
	alloc vgpu.PodAllocation
}

// Allocation starts an allocation on node with no containers.
func Allocation(node string) *AllocationBuilder {
	return &AllocationBuilder{alloc: vgpu.PodAllocation{Node: node}}
}

// Container adds an app container with no slices; Slice adds to it.
func (b *AllocationBuilder) Container(name string) *AllocationBuilder {
	b.alloc.Containers = append(b.alloc.Containers, vgpu.ContainerAllocation{Name: name})
	return b
}

// InitContainer adds an init container with no slices; Slice adds to it.
func (b *AllocationBuilder) InitContainer(name string) *AllocationBuilder {
	b.alloc.Containers = append(b.alloc.Containers, vgpu.ContainerAllocation{Name: name, Init: true})
	return b
}

// Slice adds a slice of GPU uuid to the last container added, first adding
// a container named "main" when there is none.
func (b *AllocationBuilder) Slice(uuid string, memoryMiB int64, coresPercent int) *AllocationBuilder {
	if len(b.alloc.Containers) == 0 {
		b.Container("main")
	}
	last := &b.alloc.Containers[len(b.alloc.Containers)-1]
	last.GPUs = append(last.GPUs, vgpu.GPUSlice{UUID: uuid, MemoryMiB: memoryMiB, CoresPercent: coresPercent})
	return b
}

// Obj returns the allocation built so far.
func (b *AllocationBuilder) Obj() vgpu.PodAllocation {
	a := b.alloc
	if b.alloc.Containers != nil {
		a.Containers = make([]vgpu.ContainerAllocation, len(b.alloc.Containers))
		for i, c := range b.alloc.Containers {
			if c.GPUs != nil {
				c.GPUs = append([]vgpu.GPUSlice(nil), c.GPUs...)
			}
			a.Containers[i] = c
		}
	}
	return a
}

// Usage returns the usage of pods holding allocs, each added with a zero
// request (every init container counted as a sidecar, none exclusive).
func Usage(allocs ...vgpu.PodAllocation) *vgpu.NodeUsage {
	u := &vgpu.NodeUsage{}
	for _, a := range allocs {
		u.Add(a, vgpu.PodRequest{})
	}
	return u
}

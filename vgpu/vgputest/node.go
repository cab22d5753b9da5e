package vgputest

import (
	"fmt"

	"github.com/gpuslice/gpuslice/vgpu"
)

// NodeBuilder builds a vgpu.NodeInventory. Start with Node.
type NodeBuilder struct {
	inv vgpu.NodeInventory
}

// Node starts an inventory for node name with no GPUs, SplitCount 10 and
// MemoryScaling 1 (the device plugin's defaults).
func Node(name string) *NodeBuilder {
	return &NodeBuilder{inv: vgpu.NodeInventory{Node: name, SplitCount: 10, MemoryScaling: 1}}
}

// GPU adds a healthy GPU with this UUID and memoryMiB of total and
// schedulable memory. Index and Minor are its position; the model is an
// "NVIDIA A100-SXM4-80GB", NUMA node 0, 100% cores, and the PCI bus ID is
// derived from the position.
func (b *NodeBuilder) GPU(uuid string, memoryMiB int64) *NodeBuilder {
	i := len(b.inv.GPUs)
	return b.GPUWith(vgpu.GPU{
		UUID: uuid, Index: i, Minor: i, Model: "NVIDIA A100-SXM4-80GB",
		TotalMemoryMiB: memoryMiB, SchedulableMemoryMiB: memoryMiB, CoresPercent: 100,
		PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 7+i), Health: vgpu.Healthy,
	})
}

// GPUWith adds g as given.
func (b *NodeBuilder) GPUWith(g vgpu.GPU) *NodeBuilder {
	b.inv.GPUs = append(b.inv.GPUs, g)
	return b
}

// Unhealthy marks the GPU with this UUID Unhealthy; it does nothing when
// there is none.
func (b *NodeBuilder) Unhealthy(uuid string) *NodeBuilder {
	for i := range b.inv.GPUs {
		if b.inv.GPUs[i].UUID == uuid {
			b.inv.GPUs[i].Health = vgpu.Unhealthy
		}
	}
	return b
}

// Model sets the model of the GPU with this UUID; it does nothing when
// there is none.
func (b *NodeBuilder) Model(uuid, model string) *NodeBuilder {
	return b.set(uuid, func(g *vgpu.GPU) { g.Model = model })
}

// NUMA sets the NUMA node of the GPU with this UUID (-1 for unknown).
func (b *NodeBuilder) NUMA(uuid string, node int) *NodeBuilder {
	return b.set(uuid, func(g *vgpu.GPU) { g.NUMANode = node })
}

// Cores sets the compute the GPU with this UUID offers to slices.
func (b *NodeBuilder) Cores(uuid string, percent int) *NodeBuilder {
	return b.set(uuid, func(g *vgpu.GPU) { g.CoresPercent = percent })
}

// Schedulable sets the schedulable memory of the GPU with this UUID, as
// after a driver reserve or memory scaling.
func (b *NodeBuilder) Schedulable(uuid string, memoryMiB int64) *NodeBuilder {
	return b.set(uuid, func(g *vgpu.GPU) { g.SchedulableMemoryMiB = memoryMiB })
}

func (b *NodeBuilder) set(uuid string, f func(*vgpu.GPU)) *NodeBuilder {
	for i := range b.inv.GPUs {
		if b.inv.GPUs[i].UUID == uuid {
			f(&b.inv.GPUs[i])
		}
	}
	return b
}

// SplitCount sets how many slices one GPU may hold.
func (b *NodeBuilder) SplitCount(n int) *NodeBuilder {
	b.inv.SplitCount = n
	return b
}

// MemoryScaling sets the memory scaling factor (informational only: it does
// not change SchedulableMemoryMiB of GPUs already added).
func (b *NodeBuilder) MemoryScaling(f float64) *NodeBuilder {
	b.inv.MemoryScaling = f
	return b
}

// Enforcement sets the node's enforcement mechanism.
func (b *NodeBuilder) Enforcement(e vgpu.Enforcement) *NodeBuilder {
	b.inv.Enforcement = e
	return b
}

// Obj returns the inventory built so far.
func (b *NodeBuilder) Obj() vgpu.NodeInventory {
	inv := b.inv
	if b.inv.GPUs != nil {
		inv.GPUs = append([]vgpu.GPU(nil), b.inv.GPUs...)
	}
	return inv
}

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

// Obj returns the inventory built so far.
func (b *NodeBuilder) Obj() vgpu.NodeInventory {
	inv := b.inv
	if b.inv.GPUs != nil {
		inv.GPUs = append([]vgpu.GPU(nil), b.inv.GPUs...)
	}
	return inv
}

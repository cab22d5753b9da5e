package simulate

import (
	"fmt"
	"slices"

	"github.com/gpuslice/gpuslice/vgpu"
)

// PolicyDRAGpuslice replays the tasks as DRA mode places them with gpuslice's extender scoring
// nodes (docs/dra.md): between nodes vgpu.Score under vgpu.PolicyFragmentation with the online
// workload, as PolicyFragmentation (the extender ranks the nodes kube-scheduler sends it by that
// score); inside a node the DRA allocator's first fit (vgpu.PolicyFirstFit), on devices that no
// split count bounds (vgpu.DRASplitCount). Tasks without GPUs are placed as PolicyFragmentation
// places them, where CPU is most in surplus (the extender's filter, with the chart's
// scheduler.extender.placePodsWithoutGPU).
const PolicyDRAGpuslice Policy = "dra-gpuslice"

// DRAPolicies lists the replay policies of DRA mode, in the order reports show them.
func DRAPolicies() []Policy { return []Policy{PolicyDRA, PolicyDRAGpuslice} }

// DeviceOrder is the order of a DRA-mode node's devices in its ResourceSlice, which the
// allocator's first fit follows (Config.DeviceOrder).
type DeviceOrder string

const (
	// DeviceOrderIndex is the driver's order: by GPU index, fixed.
	DeviceOrderIndex DeviceOrder = "index"
	// DeviceOrderUsed is the order of a driver that publishes its devices most used first
	// (vgpu's used share: the larger of used memory and used compute), and publishes again
	// whenever an allocation changes it: first fit then takes the most used device that fits,
	// vgpu.PolicyBinpack's choice. It assumes the slice is republished before the next
	// allocation on the node.
	DeviceOrderUsed DeviceOrder = "used"
)

// DeviceOrders lists the device orders.
func DeviceOrders() []DeviceOrder { return []DeviceOrder{DeviceOrderIndex, DeviceOrderUsed} }

// ParseDeviceOrder reads a device order name; "" is DeviceOrderIndex.
func ParseDeviceOrder(s string) (DeviceOrder, error) {
	if s == "" {
		return DeviceOrderIndex, nil
	}
	if i := slices.Index(DeviceOrders(), DeviceOrder(s)); i >= 0 {
		return DeviceOrders()[i], nil
	}
	return "", fmt.Errorf("device order %q: must be %s or %s", s, DeviceOrderIndex, DeviceOrderUsed)
}

// draGPUPolicy is the GPU policy that models the allocator's first fit over devices in order.
func draGPUPolicy(order DeviceOrder) vgpu.Policy {
	if order == DeviceOrderUsed {
		return vgpu.PolicyBinpack
	}
	return vgpu.PolicyFirstFit
}

// scoresByFragmentation reports whether p ranks nodes by vgpu.Score under
// vgpu.PolicyFragmentation against the online workload, tasks without GPUs included.
func (p Policy) scoresByFragmentation() bool {
	return p == PolicyFragmentation || p == PolicyDRAGpuslice
}

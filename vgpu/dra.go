package vgpu

import "slices"

// DRA mode (docs/dra.md): gpuslice's DRA driver publishes each GPU as one ResourceSlice device
// that many claims share, and kube-scheduler's own DRA allocator places claims. The names below
// are the driver's contract with whoever reads its slices and claims (the extender, gpuslice
// status); PolicyFirstFit and DRASplitCount are how Fit models the allocator.
const (
	// DRADriverName is the driver name, its DeviceClass and its attribute domain: a selector reads
	// device.attributes["gpuslice.hami.io"].model.
	DRADriverName = "gpuslice.hami.io"
	// DRACapacityMemory is a device's consumable memory, in bytes; a request that names none
	// gets all of it (the request policy's default).
	DRACapacityMemory = "memory"
	// DRACapacityCores is a device's consumable compute, in percent (100 per GPU); a request
	// that names none reserves none.
	DRACapacityCores = "cores"
	// DRAAttributeUUID, DRAAttributeModel, DRAAttributeIndex and DRAAttributeNUMANode are the
	// device attributes of GPU.UUID, Model, Index and NUMANode (absent when unknown).
	DRAAttributeUUID     = "uuid"
	DRAAttributeModel    = "model"
	DRAAttributeIndex    = "index"
	DRAAttributeNUMANode = "numaNode"
)

// PolicyFirstFit is the GPU order of kube-scheduler's DRA allocator, for callers that model
// DRA mode (FitOptions.GPUPolicy): each container takes the first GPUs, in the order of
// NodeInventory.GPUs (the ResourceSlice's device order), that fit; the allocator scores no
// device against another (k8s.io/dynamic-resource-allocation/structured). It is not one of
// Policies: no pod or configuration selects it, as the allocator has no policy.
const PolicyFirstFit Policy = "first-fit"

// DRASplitCount is NodeInventory.SplitCount of a DRA-mode node: no split count bounds how many
// claims share a device; its consumable memory and cores do.
const DRASplitCount = 1 << 20

// admitsUUID reports whether c may take the GPU uuid: c.UUIDs is empty or lists it.
func (c *ContainerRequest) admitsUUID(uuid string) bool {
	return len(c.UUIDs) == 0 || slices.Contains(c.UUIDs, uuid)
}

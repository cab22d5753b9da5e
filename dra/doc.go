// Package dra is gpuslice's node agent in DRA mode: a Dynamic Resource
// Allocation driver (resource.k8s.io/v1) built on the kubelet-plugin helper
// of k8s.io/dynamic-resource-allocation, over the same GPU backend
// (node/nvidia) and the same container hand-off (node/handoff) as the
// device plugin.
//
// Driver.Run publishes one ResourceSlice pool per node: every GPU is one
// device with allowMultipleAllocations and two consumable capacities,
// memory (bytes, schedulable memory = (total − reserve) × scaling) and
// cores (percent), each with a request policy whose default takes the
// whole GPU (Devices). kube-scheduler's allocator then places claims so
// that no GPU is over-committed and records per claim the device, the
// consumed capacity and a share ID; a GPU that turns unhealthy is tainted
// (NoSchedule) so no new claim lands on it, and untainted when it
// recovers.
//
// PrepareResourceClaims turns each allocation result into a slice
// (Slice) and writes one CDI spec per result with exactly the
// environment, mounts and device nodes the device-plugin mode gives a
// container (handoff.Builder), named after the claim UID and the result's
// position. It depends on the claim alone, so a claim prepared twice, or
// again after a plugin or kubelet restart, gets the same answer and the
// same file. UnprepareResourceClaims removes the claim's specs; it is a
// no-op for claims that were never prepared.
package dra

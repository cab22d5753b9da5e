package vgpu

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// HostResources is CPU and host memory: what a pod requests, or what a
// node has left that its pods do not request. Fit does not check them (the
// kube-scheduler does); PolicyFragmentation uses them to see whether a
// typical request would still fit the node's host at all.
type HostResources struct {
	// CPUMilli is CPU in thousandths of a core.
	CPUMilli int64
	// MemoryMiB is host memory.
	MemoryMiB int64
}

// PodDemand is a pod to place.
type PodDemand struct {
	// Request is what its containers ask for (RequestFromPod).
	Request PodRequest
	// Constraints are its placement annotations (ConstraintsFromPod).
	Constraints Constraints
	// Host is its CPU and memory requests; zero when unknown.
	Host HostResources
}

// DemandOf reads what pod asks of a node: its GPU request
// (RequestFromPod), its placement annotations (ConstraintsFromPod) and its
// CPU and memory requests (HostRequestOf), which the fragmentation policy
// charges the node's host with beside the GPUs. Its error says which of
// the first two is invalid and wraps theirs, which names the values; such
// a pod cannot be placed anywhere. The scheduler extender and gpuslice why
// read pods with it, so both judge the same demand. Pure; it does not
// modify pod.
func DemandOf(pod *corev1.Pod) (PodDemand, error) {
	req, err := RequestFromPod(pod)
	if err != nil {
		return PodDemand{}, fmt.Errorf("invalid GPU request: %w", err)
	}
	c, err := ConstraintsFromPod(pod)
	if err != nil {
		return PodDemand{}, fmt.Errorf("invalid placement annotation: %w", err)
	}
	return PodDemand{Request: req, Constraints: c, Host: HostRequestOf(pod)}, nil
}

// NodeState is a node as Fit sees it.
type NodeState struct {
	// Inventory is the node's GPUs.
	Inventory NodeInventory
	// Usage is what the pods on the node hold; nil means nothing.
	Usage *NodeUsage
	// HostFree is the node's allocatable CPU and memory minus what its
	// pods request; nil when unknown, and fragmentation then ignores the
	// host.
	HostFree *HostResources
}

// FitOptions are the global defaults a scheduler passes to Fit. The zero
// value is binpack for nodes and GPUs.
type FitOptions struct {
	// NodePolicy is the node policy for pods that set no
	// AnnotationNodePolicy; "" means PolicyBinpack.
	NodePolicy Policy
	// GPUPolicy is the GPU policy for pods that set no AnnotationGPUPolicy;
	// "" means PolicyBinpack.
	GPUPolicy Policy
	// Workload is the distribution of typical requests that
	// PolicyFragmentation measures fragmentation against; nil means
	// DefaultWorkload, built anew by each call that needs it, so schedulers
	// pass one. Fit only reads it.
	Workload *Workload
	// Unscored leaves the Placement's Used and Fragmentation figures, which
	// only Score reads, zero: for callers that need only whether and where
	// the pod fits (a filter, a bind), it saves measuring the node twice.
	Unscored bool
	// ReasonOnly leaves the Message of a FitError empty: Reason and
	// Container say why, and NeedMessage gives words that are the same for
	// every node the pod fails on for that reason. For callers that judge
	// many nodes and report reasons, not per-node details (a filter), it
	// saves formatting a message per node.
	ReasonOnly bool
	// NoAllocation leaves Placement.Allocation without containers when the
	// pod fits: for callers that need only whether it fits and the figures
	// Score reads (a filter, a prioritize), it saves building the
	// allocation.
	NoAllocation bool
}

// Placement is a pod's place on one node, as Fit found it, with what Score
// needs to rank the node against others.
type Placement struct {
	// Allocation is what the pod would be granted; it has no containers
	// when the pod asks for no GPU.
	Allocation PodAllocation
	// NodePolicy and GPUPolicy are the policies Fit applied: the pod's
	// annotations, else FitOptions, else PolicyBinpack.
	NodePolicy, GPUPolicy Policy
	// HealthyGPUs is how many healthy GPUs the node has.
	HealthyGPUs int
	// UsedBefore and UsedAfter are the node's healthy GPU capacity in use
	// before and after the pod, in GPUs: each GPU counts the larger of its
	// used memory share and used compute share (1 when no slice is free).
	UsedBefore, UsedAfter float64
	// FragmentationBefore and FragmentationAfter are Fragmentation of the
	// node before and after the pod, in GPUs; both are 0 unless NodePolicy
	// is PolicyFragmentation.
	FragmentationBefore, FragmentationAfter float64
	// CPUSurplusMilli is, for a pod that asks for no GPU on a node whose
	// free host CPU is known (NodeState.HostFree), the node's free CPU
	// after the pod less what its free GPU capacity would need at the
	// workload's CPU per GPU (Workload.CPUPerGPU), in thousandths of a
	// core: how much CPU the node has beyond what its GPUs' future pods
	// will want. HasCPUSurplus says it was computed.
	CPUSurplusMilli float64
	HasCPUSurplus   bool
}

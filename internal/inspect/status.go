package inspect

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// NodeStatus is one GPU node as status shows it.
type NodeStatus struct {
	// Name is the Node's name.
	Name string `json:"name"`
	// Mode is ModeDevicePlugin or ModeDRA (the gpuslice DRA driver
	// publishes a ResourceSlice for it; Ready is then whether it lists a
	// GPU, Allocatable and SplitCount are 0, and Slices count allocations).
	Mode string `json:"mode"`
	// Ready is the node's vgpu.LabelGPUReady, false when missing.
	Ready bool `json:"ready"`
	// Allocatable is the Node's allocatable vgpu.ResourceGPU (devices).
	Allocatable int64 `json:"allocatable"`
	// SplitCount is the inventory's slices per GPU; 0 without inventory.
	SplitCount int `json:"splitCount"`
	// InventoryError says why the inventory annotation could not be read;
	// empty when it was. GPUs is then empty.
	InventoryError string `json:"inventoryError,omitempty"`
	// GPUs are the inventory's GPUs in its order.
	GPUs []GPUStatus `json:"gpus"`
}

// GPUStatus is one GPU and what the pods placed on it hold, counted as the
// scheduler extender counts them (vgpu.NodeUsage).
type GPUStatus struct {
	Index  int         `json:"index"`
	UUID   string      `json:"uuid"`
	Model  string      `json:"model"`
	Health vgpu.Health `json:"health"`
	// MemoryUsedMiB of MemoryMiB (schedulable) are held by slices.
	MemoryUsedMiB int64 `json:"memoryUsedMiB"`
	MemoryMiB     int64 `json:"memoryMiB"`
	// CoresUsedPercent of CoresPercent are reserved by slices.
	CoresUsedPercent int `json:"coresUsedPercent"`
	CoresPercent     int `json:"coresPercent"`
	// Slices of SplitCount are held; Exclusive when a whole-GPU
	// container holds the GPU.
	Slices     int  `json:"slices"`
	SplitCount int  `json:"splitCount"`
	Exclusive  bool `json:"exclusive,omitempty"`
	// Pods are the "namespace/name" of the pods with a slice of it.
	Pods []string `json:"pods"`
}

// IsGPUNode reports whether n takes part in gpuslice: it has an inventory,
// the ready label or hami.io/gpu capacity.
func IsGPUNode(n *corev1.Node) bool {
	_, inv := n.Annotations[vgpu.AnnotationNodeInventory]
	_, label := n.Labels[vgpu.LabelGPUReady]
	_, capacity := n.Status.Capacity[vgpu.ResourceGPU]
	return inv || label || capacity
}

// Status returns every GPU node of s, or only the one named node when it is
// not empty (an error when s has no such GPU node).
func Status(s *Snapshot, node string) ([]NodeStatus, error) {
	placed := s.placed()
	var out []NodeStatus
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if node != "" && n.Name != node {
			continue
		}
		switch {
		case s.IsDRANode(n):
			out = append(out, s.draNodeStatus(n))
		case IsGPUNode(n):
			out = append(out, nodeStatus(n, placed[n.Name]))
		}
	}
	if node != "" && len(out) == 0 {
		return nil, fmt.Errorf("--node=%s: no such GPU node (one with %s, label %s, %s capacity or a ResourceSlice of %s)", node, vgpu.AnnotationNodeInventory, vgpu.LabelGPUReady, vgpu.ResourceGPU, DRADriverName)
	}
	return out, nil
}

// placedPod is a pod that holds slices on its node.
type placedPod struct {
	key   string
	alloc vgpu.PodAllocation
	req   vgpu.PodRequest
}

// placed returns, by node, the pods that count on it as the extender counts
// them: bound, not terminal, with an allocation that parses and names the
// node the pod is bound to.
func (s *Snapshot) placed() map[string][]placedPod {
	out := map[string][]placedPod{}
	for i := range s.Pods {
		p := &s.Pods[i]
		raw, ok := p.Annotations[vgpu.AnnotationPodAllocation]
		if !ok || p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		a, err := vgpu.ParsePodAllocation(raw)
		if err != nil || a.Node != p.Spec.NodeName {
			continue
		}
		// A spec vgpu rejects counts with the zero request, as in the
		// extender (vgpu.NodeUsage.Add).
		req, _ := vgpu.RequestFromPod(p)
		out[a.Node] = append(out[a.Node], placedPod{key: p.Namespace + "/" + p.Name, alloc: a, req: req})
	}
	return out
}

// usageOf returns what pods hold on their node, leaving out the pod with
// key skip.
func usageOf(pods []placedPod, skip string) *vgpu.NodeUsage {
	u := &vgpu.NodeUsage{}
	for _, p := range pods {
		if p.key != skip {
			u.Add(p.alloc, p.req)
		}
	}
	return u
}

func nodeStatus(n *corev1.Node, pods []placedPod) NodeStatus {
	alloc := n.Status.Allocatable[vgpu.ResourceGPU]
	ns := NodeStatus{Name: n.Name, Mode: ModeDevicePlugin, Allocatable: alloc.Value(), GPUs: []GPUStatus{}}
	ns.Ready, _ = vgpu.ParseReadyLabel(n.Labels[vgpu.LabelGPUReady])
	inv, err := inventoryOf(n)
	if err != nil {
		ns.InventoryError = err.Error()
		return ns
	}
	ns.SplitCount = inv.SplitCount
	usage := usageOf(pods, "")
	holders := map[string][]string{}
	for _, p := range pods {
		for _, c := range p.alloc.Containers {
			for _, sl := range c.GPUs {
				if !slices.Contains(holders[sl.UUID], p.key) {
					holders[sl.UUID] = append(holders[sl.UUID], p.key)
				}
			}
		}
	}
	for _, g := range inv.GPUs {
		u := usage.GPU(g.UUID)
		ns.GPUs = append(ns.GPUs, GPUStatus{
			Index: g.Index, UUID: g.UUID, Model: g.Model, Health: g.Health,
			MemoryUsedMiB: u.MemoryMiB, MemoryMiB: g.SchedulableMemoryMiB,
			CoresUsedPercent: u.CoresPercent, CoresPercent: g.CoresPercent,
			Slices: u.Slices, SplitCount: inv.SplitCount, Exclusive: u.Exclusive > 0,
			Pods: append([]string{}, holders[g.UUID]...),
		})
	}
	return ns
}

// inventoryOf parses n's inventory and checks that it names n, as the
// extender does; vgpu.ErrNoInventory when n has none.
func inventoryOf(n *corev1.Node) (vgpu.NodeInventory, error) {
	raw, ok := n.Annotations[vgpu.AnnotationNodeInventory]
	if !ok {
		return vgpu.NodeInventory{}, vgpu.ErrNoInventory
	}
	inv, err := vgpu.ParseNodeInventory(raw)
	if err != nil {
		return vgpu.NodeInventory{}, err
	}
	if inv.Node != n.Name {
		return vgpu.NodeInventory{}, fmt.Errorf("%s names node %q, not %q", vgpu.AnnotationNodeInventory, inv.Node, n.Name)
	}
	return inv, nil
}

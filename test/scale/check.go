package scale

import (
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// GPUUse is what the bound pods hold on one GPU, summed from their allocation annotations.
type GPUUse struct {
	// MemoryMiB and CoresPercent are the sums of the slices' memory and compute; Slices counts
	// them, an exclusive (whole-GPU) slice as the node's SplitCount.
	MemoryMiB    int64
	CoresPercent int
	Slices       int
}

// CheckResult is what Check found.
type CheckResult struct {
	// Pods is how many bound GPU pods were checked.
	Pods int
	// Use is every used GPU's total, by node and GPU UUID.
	Use map[string]map[string]GPUUse
	// Violations says, one entry per problem, what breaks the rules: a bound GPU pod without a
	// valid allocation, an allocation that names another node, an unknown GPU or a slice that
	// differs from the request, and any GPU holding more than its inventory offers.
	Violations []error
}

// Err joins the violations, or is nil.
func (r CheckResult) Err() error { return errors.Join(r.Violations...) }

// Check reads every bound pod of phase from the harness's watch and checks the extender's
// grants against the hollow nodes' inventories; see CheckPods.
func (h *Harness) Check(phase string) CheckResult {
	return CheckPods(h.watch.pods(phase), h.nodes)
}

// CheckPods checks the allocations of the bound pods among pods that ask for GPUs against the
// inventories of nodes: each must carry a valid allocation annotation for its node, with one
// slice on a distinct GPU of that node per requested GPU and each slice's memory and compute as
// requested; and on each GPU the slices' memory must not exceed SchedulableMemoryMiB, their
// compute CoresPercent, and their count SplitCount (an exclusive slice counts SplitCount).
// Host resources are kube-scheduler's business and not checked. It is pure.
func CheckPods(pods []*corev1.Pod, nodes map[string]NodeSpec) CheckResult {
	res := CheckResult{Use: map[string]map[string]GPUUse{}}
	fail := func(pod *corev1.Pod, format string, args ...any) {
		res.Violations = append(res.Violations, fmt.Errorf("pod %s/%s on %s: %s", pod.Namespace, pod.Name, pod.Spec.NodeName, fmt.Sprintf(format, args...)))
	}
	for _, pod := range pods {
		if pod.Spec.NodeName == "" {
			continue
		}
		req, err := vgpu.RequestFromPod(pod)
		if err != nil || len(req.Containers) == 0 {
			continue // not a GPU pod (the webhook refuses invalid requests)
		}
		res.Pods++
		raw, ok := pod.Annotations[vgpu.AnnotationPodAllocation]
		if !ok {
			fail(pod, "bound without a %s annotation", vgpu.AnnotationPodAllocation)
			continue
		}
		alloc, err := vgpu.ParsePodAllocation(raw)
		if err != nil {
			fail(pod, "%v", err)
			continue
		}
		if alloc.Node != pod.Spec.NodeName {
			fail(pod, "allocation names node %q", alloc.Node)
			continue
		}
		spec, ok := nodes[pod.Spec.NodeName]
		if !ok {
			fail(pod, "bound to a node the harness did not create")
			continue
		}
		use := res.Use[spec.Name]
		if use == nil {
			use = map[string]GPUUse{}
			res.Use[spec.Name] = use
		}
		for _, cr := range req.Containers {
			ca, ok := alloc.Container(cr.Name)
			if !ok {
				fail(pod, "container %s has no allocation", cr.Name)
				continue
			}
			if len(ca.GPUs) != cr.GPUs {
				fail(pod, "container %s has %d slices, asked for %d", cr.Name, len(ca.GPUs), cr.GPUs)
			}
			for _, s := range ca.GPUs {
				g, ok := spec.Inventory.GPU(s.UUID)
				if !ok {
					fail(pod, "container %s: GPU %s is not the node's", cr.Name, s.UUID)
					continue
				}
				want := cr.MemoryMiB
				if cr.MemoryPercent > 0 {
					want = g.SchedulableMemoryMiB * int64(cr.MemoryPercent) / vgpu.MaxPercent
				}
				if s.MemoryMiB != want || s.CoresPercent != cr.CoresPercent {
					fail(pod, "container %s: slice on %s has %d MiB and %d%% cores, asked for %d MiB (%d%%) and %d%%",
						cr.Name, s.UUID, s.MemoryMiB, s.CoresPercent, cr.MemoryMiB, cr.MemoryPercent, cr.CoresPercent)
				}
				u := use[s.UUID]
				u.MemoryMiB += s.MemoryMiB
				u.CoresPercent += s.CoresPercent
				if cr.Exclusive {
					u.Slices += spec.Inventory.SplitCount
				} else {
					u.Slices++
				}
				use[s.UUID] = u
			}
		}
	}
	for _, node := range sortedKeys(res.Use) {
		spec := nodes[node]
		for _, uuid := range sortedKeys(res.Use[node]) {
			u := res.Use[node][uuid]
			g, _ := spec.Inventory.GPU(uuid)
			if u.MemoryMiB > g.SchedulableMemoryMiB || u.CoresPercent > g.CoresPercent || u.Slices > spec.Inventory.SplitCount {
				res.Violations = append(res.Violations, fmt.Errorf("node %s GPU %s over-committed: %d MiB of %d, %d%% of %d%% cores, %d slices of %d",
					node, uuid, u.MemoryMiB, g.SchedulableMemoryMiB, u.CoresPercent, g.CoresPercent, u.Slices, spec.Inventory.SplitCount))
			}
		}
	}
	return res
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

package drascore

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// draPod is a pod's unallocated claims as the DRA scoring places them: one request of each
// claim per container, in the order kube-scheduler allocates them (the pod's claims in order,
// each claim's requests in order).
type draPod struct {
	requests []draPodRequest
	numa     bool
	// host is the pod's CPU and memory requests.
	host vgpu.HostResources
}

// draPodRequest is one request with every CEL expression a device must match: its class's,
// then its own.
type draPodRequest struct {
	claimRequest
	claim     string
	selectors []string
}

// draPodLocked reads the claims of pod that exist, are the pod's (a claim made from a template
// must be owned by the pod) and are not allocated yet, with the requests that name a DeviceClass
// the extender knows. Callers hold d's read lock.
func (d *State) draPodLocked(pod *corev1.Pod) draPod {
	out := draPod{host: vgpu.HostRequestOf(pod)}
	for name, mustCheckOwner := range resourceclaim.PodClaims(pod) {
		c := d.claims[pod.Namespace+"/"+name]
		if c == nil || c.allocated || mustCheckOwner && c.owner != pod.UID {
			continue
		}
		out.numa = out.numa || c.numa
		for _, r := range c.requests {
			class, ok := d.classes[r.class]
			if !ok {
				continue
			}
			out.requests = append(out.requests, draPodRequest{claimRequest: r, claim: name, selectors: slices.Concat(class, r.selectors)})
		}
	}
	return out
}

// PodRequests is how many requests of pod's claims Score would place: see draPodLocked.
func (d *State) PodRequests(pod *corev1.Pod) int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.draPodLocked(pod).requests)
}

// HostReader reads the cluster state the scoring needs besides its own: ReadHosts calls fn once,
// with the workload Fit measures fragmentation against and each node's free CPU and memory (nil
// where the node is unknown or has no allocatable), and holds the cluster state's read lock
// while fn runs, so fn must not take it. State calls it with its own read lock held.
type HostReader interface {
	ReadHosts(fn func(w *vgpu.Workload, hostFree func(node string) *vgpu.HostResources))
}

// Result is a pod scored on the candidate nodes (Score).
type Result struct {
	// Scores are by position of the names asked about: nil where the pod does not fit, or on a
	// node that is no DRA node.
	Scores []*vgpu.NodeScore
	// Demand is the pod's demand, as the online workload counts it.
	Demand vgpu.PodDemand
}

// Score places pod's claims on each node of names as kube-scheduler's DRA allocator would —
// each request on the first devices, in the node's ResourceSlice order, that match its class's
// and its own selectors and have its capacity free — and scores each node where they fit by
// vgpu.Score under the node policy (the pod's hami.io/node-policy, else the FitOptions given to
// New). It reports false when the pod is to be scored neutrally: its claims ask for no gpuslice
// device (a request is gpuslice's when some node of names has a device of the driver that its
// selectors match), or a gpuslice request is one the scoring does not model (a prioritized
// list, allocation mode All, admin access). Allocated claims (a shared claim placed before) add
// nothing.
//
// It takes State's read lock, then the cluster state's through HostReader; safe to call
// concurrently.
func (d *State) Score(ctx context.Context, pod *corev1.Pod, names []string) (Result, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	p := d.draPodLocked(pod)
	if len(p.requests) == 0 {
		return Result{}, false
	}
	// eligible[i][r]: the devices of node i that request r's selectors match, by UUID; nil where
	// the node is no DRA node.
	eligible := make([][][]string, len(names))
	ours := make([]bool, len(p.requests))
	for i, name := range names {
		n := d.nodes[name]
		if n == nil {
			continue
		}
		eligible[i] = make([][]string, len(p.requests))
		for r := range p.requests {
			for pos := range n.inv.GPUs {
				if d.matchesAllLocked(ctx, n, p.requests[r].selectors, pos) {
					eligible[i][r] = append(eligible[i][r], n.inv.GPUs[pos].UUID)
				}
			}
			ours[r] = ours[r] || len(eligible[i][r]) > 0
		}
	}
	// The requests of other drivers' classes are left to their allocator.
	var keep []int
	for r := range p.requests {
		if !ours[r] {
			continue
		}
		if !p.requests[r].modeled {
			return Result{}, false
		}
		keep = append(keep, r)
	}
	if len(keep) == 0 {
		return Result{}, false
	}
	demand := p.demand(keep)
	cons, err := vgpu.ConstraintsFromPod(pod)
	if err == nil {
		demand.Constraints.NodePolicy = cons.NodePolicy
	}
	opts := d.fit
	opts.GPUPolicy, opts.ReasonOnly, opts.NoAllocation = vgpu.PolicyFirstFit, true, true

	scores := make([]*vgpu.NodeScore, len(names))
	d.hosts.ReadHosts(func(w *vgpu.Workload, hostFree func(node string) *vgpu.HostResources) {
		opts.Workload = w
		for i, name := range names {
			n := d.nodes[name]
			if n == nil {
				continue
			}
			on := demand
			on.Request.Containers = slices.Clone(demand.Request.Containers)
			fits := true
			for k, r := range keep {
				uuids := eligible[i][r]
				switch {
				case len(uuids) == 0:
					fits = false
				case len(uuids) < len(n.inv.GPUs):
					on.Request.Containers[k].UUIDs = uuids
				}
			}
			if !fits {
				continue
			}
			placed, err := vgpu.Fit(on, vgpu.NodeState{Inventory: n.inv, Usage: &n.usage, HostFree: hostFree(name)}, opts)
			if err == nil {
				score := vgpu.Score(placed)
				scores[i] = &score
			}
		}
	})
	return Result{Scores: scores, Demand: demand}, true
}

// matchesAllLocked reports whether device pos of n matches every expression.
func (d *State) matchesAllLocked(ctx context.Context, n *draNode, exprs []string, pos int) bool {
	for _, e := range exprs {
		if !d.matchesLocked(ctx, n, e, pos) {
			return false
		}
	}
	return true
}

// demand is the vgpu demand of requests keep of p: one app container per request (a claim holds
// its devices for the pod's life), GPUs its count, memory its memory (all of it when none is
// named), cores its cores; a request for all memory and all cores is whole GPUs. The model
// filter is the first request's selectors as the webhook or the chart's model classes write
// them, for the workload's class.
func (p draPod) demand(keep []int) vgpu.PodDemand {
	out := vgpu.PodDemand{Host: p.host, Constraints: vgpu.Constraints{NUMABind: p.numa}}
	for k, r := range keep {
		req := p.requests[r]
		c := vgpu.ContainerRequest{Name: req.claim + "/" + req.name, GPUs: req.count, MemoryMiB: req.memoryMiB, CoresPercent: req.cores}
		switch {
		case req.otherCapacity || req.memoryMiB < 0:
			c.MemoryMiB = vgpu.MaxMemoryMiB + 1 // no device takes it
		case req.memoryMiB == 0:
			c.MemoryPercent = vgpu.MaxPercent
			c.Exclusive = req.cores >= vgpu.MaxPercent
		}
		out.Request.Containers = append(out.Request.Containers, c)
		if k == 0 {
			for _, e := range req.selectors {
				if models, exclude, ok := selectorModels(e); ok {
					out.Constraints.Models = append(out.Constraints.Models, models...)
					out.Constraints.ExcludeModels = append(out.Constraints.ExcludeModels, exclude...)
				}
			}
		}
	}
	return out
}

// Rank ranks scores (nil: does not fit) onto kube-scheduler's extender range: the best
// extenderv1.MaxExtenderPriority, each worse distinct score (vgpu.NodeScore.Compare) one less,
// at least 1; nil gets 0. The result is by position of scores.
func Rank(scores []*vgpu.NodeScore) []int64 {
	var order []int
	for i, s := range scores {
		if s != nil {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return scores[b].Compare(*scores[a]) })
	out := make([]int64, len(scores))
	rank := int64(0)
	for k, i := range order {
		if k > 0 && scores[i].Compare(*scores[order[k-1]]) != 0 {
			rank++
		}
		out[i] = max(extenderv1.MaxExtenderPriority-rank, 1)
	}
	return out
}

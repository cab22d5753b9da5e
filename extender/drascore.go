package extender

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"
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
func (d *draState) draPodLocked(pod *corev1.Pod) draPod {
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

// PrioritizeDRA scores the candidate nodes for a pod whose claims ask for gpuslice's DRA devices,
// for a kube-scheduler extender with prioritizeVerb dra/prioritize and no managedResources (asked
// about every pod of the profile). On each node it places the claims' requests as the allocator
// would — each request on the first devices, in the node's ResourceSlice order, that match its
// class's and its own selectors and have its capacity free — and scores the node by vgpu.Score
// under the node policy (the pod's hami.io/node-policy, else Config.NodePolicy). The nodes are
// then ranked: the best score gets extenderv1.MaxExtenderPriority, each worse distinct score one
// less, down to 1; nodes where the requests do not fit get 0.
//
// Every node scores 0 — neutral, leaving the choice to kube-scheduler's own scores — for a pod
// whose claims ask for no gpuslice device (a request is gpuslice's when some candidate node has
// a device of the driver that its selectors match), for a pod with a gpuslice request the
// scoring does not model (a prioritized list, allocation mode All, admin access), and before the
// informers synced. Allocated claims (a shared claim placed before) add nothing. The first time
// it scores a pod, the online workload counts the pod's requests (Config.Workload).
//
// It reads the informers' state only and is safe to call concurrently; the error wraps
// ErrBadArgs.
func (s *Scheduler) PrioritizeDRA(ctx context.Context, args *extenderv1.ExtenderArgs) (extenderv1.HostPriorityList, error) {
	names, err := candidates(args)
	if err != nil {
		return nil, err
	}
	list := make(extenderv1.HostPriorityList, len(names))
	for i, name := range names {
		list[i].Host = name
	}
	if s.dra == nil || !s.Ready() {
		return list, nil
	}
	scores, demand, ok := s.draScores(ctx, args.Pod, names)
	if !ok {
		return list, nil
	}
	if s.workload != nil && s.dra.countOnce(args.Pod.UID) {
		s.workload.add(demand)
	}
	for i, v := range rankScores(scores) {
		list[i].Score = v
	}
	klog.FromContext(ctx).V(5).Info("Prioritized DRA pod", "pod", klog.KObj(args.Pod), "scores", list)
	return list, nil
}

// draScores places pod on each node of names: the score where it fits (nil where it does not),
// and the pod's demand for the workload. ok is false when the pod is scored neutrally (see
// PrioritizeDRA).
func (s *Scheduler) draScores(ctx context.Context, pod *corev1.Pod, names []string) (scores []*vgpu.NodeScore, demand vgpu.PodDemand, ok bool) {
	d := s.dra
	d.mu.RLock()
	defer d.mu.RUnlock()
	p := d.draPodLocked(pod)
	if len(p.requests) == 0 {
		return nil, vgpu.PodDemand{}, false
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
			return nil, vgpu.PodDemand{}, false
		}
		keep = append(keep, r)
	}
	if len(keep) == 0 {
		return nil, vgpu.PodDemand{}, false
	}
	demand = p.demand(keep)
	cons, err := vgpu.ConstraintsFromPod(pod)
	if err == nil {
		demand.Constraints.NodePolicy = cons.NodePolicy
	}
	opts := s.fitOptions
	opts.GPUPolicy, opts.ReasonOnly, opts.NoAllocation = vgpu.PolicyFirstFit, true, true

	st := s.state
	st.mu.RLock()
	defer st.mu.RUnlock()
	opts.Workload = st.workload
	scores = make([]*vgpu.NodeScore, len(names))
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
		var host *vgpu.HostResources
		if ns := st.nodes[name]; ns != nil {
			host = ns.hostFreeLocked()
		}
		placed, err := vgpu.Fit(on, vgpu.NodeState{Inventory: n.inv, Usage: &n.usage, HostFree: host}, opts)
		if err == nil {
			score := vgpu.Score(placed)
			scores[i] = &score
		}
	}
	return scores, demand, true
}

// matchesAllLocked reports whether device pos of n matches every expression.
func (d *draState) matchesAllLocked(ctx context.Context, n *draNode, exprs []string, pos int) bool {
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

// rankScores ranks scores (nil: does not fit) onto kube-scheduler's extender range: the best
// extenderv1.MaxExtenderPriority, each worse distinct score (vgpu.NodeScore.Compare) one less,
// at least 1; nil gets 0.
func rankScores(scores []*vgpu.NodeScore) []int64 {
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

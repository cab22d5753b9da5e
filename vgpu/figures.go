package vgpu

import (
	"math"
	"math/bits"
)

// NodeFigures is what a NodeSummary says of its node without reading its
// GPUs: enough for Reject and ScoreBound. A small value: a scheduler that
// screens thousands of nodes for each pod may keep a copy beside its own
// per-node state (NodeSummary.NodeFigures), and screen them without
// reading any summary.
type NodeFigures struct {
	healthy int
	// largestFreeMiB is the most memory free on one healthy GPU that has
	// a free slice (-1 when none has); sliceable counts those GPUs.
	largestFreeMiB int64
	sliceable      int
	// usedBefore is the healthy capacity in use, in GPUs (Placement.UsedBefore).
	usedBefore float64
	// What ScoreBound reads, over the GPUs with a free slice: the least
	// memory one offers (MiB) and the least positive cores cap (0: none
	// has one), and the most a slice can raise one's used share by
	// filling its last slot or holding no memory (0: none can).
	minSchedulableMiB int64
	minCoresCap       int
	maxJump           float64
	// fragBefore is the node's fragmentation against fragWorkload (nil:
	// not measured): no pod lowers it by more. maxUnusable is, over the
	// GPUs with a free slot, the most of fragWorkload's share that cannot
	// use one's free capacity (1 when the workload has too many shapes to
	// tell). Both are set by boundFragmentation.
	fragBefore   float64
	fragWorkload *Workload
	maxUnusable  float64
	// hostKnown is true when the node's free CPU and memory are known
	// (host); hostBounds when they bound what some class of
	// fragWorkload can use. gpus counts the node's GPUs, healthy or not.
	hostKnown, hostBounds bool
	host                  HostResources
	gpus                  int
}

// boundGPU folds GPU g, holding u and with a free slice, into the
// summary's figures for ScoreBound.
func (s *NodeSummary) boundGPU(g *GPU, u GPUUsage) {
	if s.sliceable == 1 || g.SchedulableMemoryMiB < s.minSchedulableMiB {
		s.minSchedulableMiB = g.SchedulableMemoryMiB
	}
	if g.CoresPercent > 0 && (s.minCoresCap == 0 || g.CoresPercent < s.minCoresCap) {
		s.minCoresCap = g.CoresPercent
	}
	// shareOf counts a GPU whose slots are all taken, or that offers no
	// memory, as wholly used, whatever its memory and cores.
	if u.Slices+1 >= s.inv.SplitCount || g.SchedulableMemoryMiB <= 0 {
		s.maxJump = max(s.maxJump, 1-usedShare(g, u, s.inv.SplitCount))
	}
}

// boundFragmentation records the figures ScoreBound reads of the node's
// fragmentation against w, as f measured it; the cells' masks are set.
func (s *NodeSummary) boundFragmentation(w *Workload, f *fragSummary) {
	s.fragBefore, s.fragWorkload, s.hostBounds = f.before, w, f.weight[0].capped != nil
	s.maxUnusable = 1
	if f.masks == nil {
		return // no masks to tell which shapes can use a GPU
	}
	s.maxUnusable = 0
	for i := range s.cells {
		c := &s.cells[i]
		if c.exclusive != 0 || c.slices >= s.inv.SplitCount {
			continue
		}
		// The share of the workload that can use the GPU's free capacity
		// now (fragModel.delta's "left" shapes).
		var usable float64
		if c.share < 1 {
			for mask := c.mask; mask != 0; mask &= mask - 1 {
				si := bits.TrailingZeros64(mask)
				usable += f.weight[0].at(&w.shapes[si], si, f.cnt[si])
			}
		}
		s.maxUnusable = max(s.maxUnusable, 1-usable)
	}
}

// ScoreBound returns a node score (NodeScore.Value) that the placement
// NodeSummary.Fit(pod, opts) gives on this node never scores above, from
// the summary's figures alone: for a scheduler that wants only the nodes
// of the best score, every node whose bound is below a score already found
// need not be fitted. For a pod of one slice (as Reject takes) the slice
// raises one GPU's used share, by at most rise (its memory or cores over
// the smallest GPU's, or a GPU's whole free share when it takes the last
// slot), so:
//   - PolicyBinpack: 100 × (used + rise) / healthy GPUs;
//   - PolicySpread: 100 × (1 − used / healthy GPUs), as the share only
//     rises;
//   - PolicyFragmentation: 50 + 25 × the least of rise and the node's
//     fragmentation. Fragmentation never falls below 0 (the classes'
//     shares add up to at most 1), so by no more than it is, when it was
//     measured against opts.Workload. It falls by no more than the free
//     capacity the slice takes (every class can use at most what is
//     free), and by no more than the part of it that the classes able to
//     use the GPU could not (the most of that share over the node's GPUs
//     with a free slot, when measured against opts.Workload), when, once
//     the pod is placed, the node's host bounds no class of
//     opts.Workload: its free CPU and memory are unknown, or feed every
//     class on every GPU after the pod's host requests, or the pod
//     requests none and they bound no class before, and opts.Workload
//     counts no expected fills (it has no supply: see fill.go).
//     Otherwise rise counts as 1.
//
// Other pods get MaxScore: no bound. Safe for concurrent use.
func (s *NodeFigures) ScoreBound(pod PodDemand, opts FitOptions) int {
	if !oneSlice(pod) {
		return MaxScore
	}
	if s.healthy == 0 || s.sliceable == 0 {
		return 0 // Score of a node with no healthy GPU; nothing fits else
	}
	cr := pod.Request.Containers[0]
	rise := s.maxJump
	switch {
	case cr.MemoryMiB > 0:
		rise = max(rise, float64(cr.MemoryMiB)/float64(s.minSchedulableMiB))
	default:
		rise = max(rise, float64(cr.MemoryPercent)/MaxPercent)
	}
	if s.minCoresCap > 0 {
		rise = max(rise, float64(cr.CoresPercent)/float64(s.minCoresCap))
	}
	rise = min(rise, 1)
	healthy := float64(s.healthy)
	var value float64
	switch resolve(pod.Constraints.NodePolicy, opts.NodePolicy) {
	case PolicySpread:
		value = MaxScore * (1 - s.usedBefore/healthy)
	case PolicyFragmentation:
		measured := s.fragWorkload != nil && opts.Workload == s.fragWorkload
		switch unbounded := s.unboundedAfter(pod, opts.Workload, measured); {
		case !unbounded:
			// A host that bounds what some classes can use gives them
			// a share of each GPU that grows as GPUs drop out of their
			// reach: the slice may then lower fragmentation by more
			// than it takes.
			rise = 1
		case opts.Workload != nil && opts.Workload.fill != nil:
			// Counting expected fills, a slice may leave its GPU's
			// free share worth more than before (0.41 that slices
			// fill well, from 0.88 that none does): up to all of the
			// GPU's free share.
			rise = 1
		case measured:
			// Of the capacity the slice takes, what the classes that
			// can use the GPU could use was not fragmented.
			rise *= s.maxUnusable
		}
		if measured {
			// Fragmentation is never below 0: no pod lowers it by more
			// than it is.
			rise = min(rise, s.fragBefore)
		}
		value = MaxScore/2 + MaxScore/4*rise
	default:
		value = MaxScore * (s.usedBefore + rise) / healthy
	}
	// Score sums the shares in another order; boundSlack covers the
	// difference before Score rounds.
	return int(math.Round(min(max(value+boundSlack, 0), MaxScore)))
}

// unboundedAfter reports whether, once pod is placed, the node's host
// bounds no class of w (fillWeights makes no capped weights): its free CPU
// and memory are unknown; or they still feed every class on every GPU
// after the pod's host requests; or the pod requests none and they bound
// no class before it (measured: the summary's figures are for w).
func (s *NodeFigures) unboundedAfter(pod PodDemand, w *Workload, measured bool) bool {
	switch {
	case !s.hostKnown:
		return true
	case w == nil:
		return false
	case pod.Host == (HostResources{}):
		return measured && !s.hostBounds
	}
	room := HostResources{CPUMilli: s.host.CPUMilli - pod.Host.CPUMilli, MemoryMiB: s.host.MemoryMiB - pod.Host.MemoryMiB}
	return w.feedsAll(room, w.hostFeeds(room), s.gpus)
}

// boundSlack is what ScoreBound adds before it rounds, far above the
// rounding error of summing a node's shares and far below a score step.
const boundSlack = 1e-6

// Reject reports the reason Fit would give for pod on this node without
// running it, from the summary's figures alone, and true — for a pod of one
// app container asking for one slice of one GPU by MiB, with no model or
// UUID filter nor enforcement requirement, when the node has no healthy GPU, no GPU with a free slice,
// or too little memory free on every such GPU. Otherwise it returns false
// and the caller asks Fit. Callers that judge many nodes use it as an
// index by largest free slice: most full nodes are turned away without
// looking at their GPUs.
func (s *NodeFigures) Reject(pod PodDemand) (Reason, bool) {
	if !oneSlice(pod) || pod.Request.Containers[0].MemoryMiB <= 0 {
		return "", false
	}
	switch {
	case s.healthy == 0:
		return ReasonUnhealthy, true
	case s.sliceable == 0:
		return ReasonNoFreeSlice, true
	case s.largestFreeMiB < pod.Request.Containers[0].MemoryMiB:
		return ReasonInsufficientMemory, true
	}
	return "", false
}

// oneSlice reports whether pod is the commonest kind, which the summary
// answers alone: one app container asking for one slice of one GPU, with
// no model or UUID filter and no enforcement requirement.
func oneSlice(pod PodDemand) bool {
	cs, c := pod.Request.Containers, pod.Constraints
	return len(cs) == 1 && !cs[0].Init && cs[0].GPUs == 1 && !cs[0].Exclusive && len(cs[0].UUIDs) == 0 &&
		len(c.Models) == 0 && len(c.ExcludeModels) == 0 && len(c.UUIDs) == 0 && len(c.ExcludeUUIDs) == 0 &&
		!c.Enforcement.Required
}

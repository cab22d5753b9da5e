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
	// use one's free capacity, and maxCellFrag the most fragmentation one
	// of them holds: its free share less what the classes the node's
	// measure counts use of it (both 1 when the workload has too many
	// shapes to tell). All are set by boundFragmentation.
	fragBefore   float64
	fragWorkload *Workload
	maxUnusable  float64
	maxCellFrag  float64
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
	s.maxUnusable, s.maxCellFrag = 1, 1
	if f.masks == nil {
		return // no masks to tell which shapes can use a GPU
	}
	s.maxUnusable, s.maxCellFrag = 0, 0
	m := fragModel{w: w, fill: f.fill, lambda: f.lambda}
	for i := range s.cells {
		c := &s.cells[i]
		if c.exclusive != 0 || c.slices >= s.inv.SplitCount {
			continue
		}
		// The share of the workload that can use the GPU's free capacity
		// now (fragModel.delta's "left" shapes), and what the classes
		// that fragModel.measure counts use of it (cellDelta's value0).
		var usable, used float64
		if free := 1 - c.share; free > 0 {
			value := free
			if f.fill && c.usage() != (GPUUsage{}) {
				value = m.valueAt(c.fill, c.admitted, free, w.fullOf(c.mask))
			}
			for mask := c.mask; mask != 0; mask &= mask - 1 {
				si := bits.TrailingZeros64(mask)
				weight := f.weight[0].at(&w.shapes[si], si, f.cnt[si]) // 0 for a shape out of the node's reach
				usable += weight
				used += weight * value
			}
		}
		c.unusable, c.frag = 1-usable, 1-c.share-used
		s.maxUnusable = max(s.maxUnusable, c.unusable)
		s.maxCellFrag = max(s.maxCellFrag, c.frag)
	}
}

// ScoreBound returns a node score whose Value, Raw and Tie the placement
// NodeSummary.Fit(pod, opts) gives on this node never exceeds, from the
// summary's figures alone. For a scheduler that wants only the nodes of
// the best score, a node need not be fitted when its bound's Value is
// below the best Value found, or its Raw below the best Raw found (Value
// never rises when Raw falls; under fragmentation most nodes of a cluster
// may tie at one Value), or its Raw no higher and its Tie below (many
// nodes tie at one Raw too, where a slice changes no fragmentation). For a pod of one slice (as Reject takes) the
// slice raises one GPU's used share, by at most rise (its memory or cores
// over the smallest GPU's, or a GPU's whole free share when it takes the
// last slot), so Raw is at most (each policy's rawBound):
//   - PolicyBinpack: (used + rise) / healthy GPUs;
//   - PolicySpread: 1 − used / healthy GPUs, as the share only rises;
//   - PolicyFragmentation: how far the slice can lower the node's
//     fragmentation. Measured against opts.Workload, no further than the
//     node's fragmentation, which is never below 0 (the classes' shares
//     add up to at most 1). When, once the pod is placed, the node's host
//     bounds no class of opts.Workload (its free CPU and memory are
//     unknown, or feed every class on every GPU after the pod's host
//     requests, or the pod requests none and they bound no class before),
//     and it was measured against opts.Workload, also no further than
//     its most fragmented GPU with a free slot holds (the GPU's free share
//     less what the classes use of it: what they use of it after is at
//     most its free share after, and of the other GPUs no more than
//     before); and, when opts.Workload counts no expected fills (it has
//     no supply: see fill.go), no further than the free capacity the
//     slice takes times the most of the workload's share that cannot use
//     a GPU with a free slot. Otherwise it may lower fragmentation by a
//     whole GPU: a host that bounds some classes gives them a share of
//     each GPU that grows as GPUs drop out of their reach, and counting
//     expected fills a slice may leave its GPU's free share worth more.
//
// Value is what Score gives that Raw. Tie, under PolicyFragmentation, is
// (used + rise) / healthy GPUs (0 otherwise, as Score's). Other pods get
// MaxScore and an infinite Raw and Tie: no bound. Safe for concurrent use.
func (s *NodeFigures) ScoreBound(pod PodDemand, opts FitOptions) NodeScore {
	if !oneSlice(pod) {
		return NodeScore{Value: MaxScore, Raw: math.Inf(1), Tie: math.Inf(1)}
	}
	if s.healthy == 0 || s.sliceable == 0 {
		return NodeScore{} // Score of a node with no healthy GPU; nothing fits else
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
	r := rulesOf(resolve(pod.Constraints.NodePolicy, opts.NodePolicy))
	var fall float64
	if r.fragmentation {
		fall = s.fallRule(pod, opts).fall(rise, s.maxUnusable, s.maxCellFrag)
	}
	healthy := float64(s.healthy)
	after := (s.usedBefore + rise) / healthy
	raw := r.rawBound(s.usedBefore/healthy, after, fall)
	return NodeScore{Value: boundValue(r.value(raw)), Raw: raw + rawSlack, Tie: r.tie(after) + rawSlack}
}

// boundValue is the Value bound of a score value: Score sums the shares
// in another order, and boundSlack covers the difference before it
// rounds.
func boundValue(value float64) int {
	return int(math.Round(min(max(value+boundSlack, 0), MaxScore)))
}

// fallRule is which figures bound how far a slice can lower a node's
// fragmentation (ScoreBound): decided once per pod and node by
// NodeFigures.fallRule, applied to each GPU by fall.
type fallRule struct {
	by fallBy
	// limit is the node's fragmentation when measured against the pod's
	// workload (no pod lowers it by more), else +Inf.
	limit float64
}

// fallBy says what bounds the fall on one GPU.
type fallBy int

const (
	// fallByRise: the free capacity the slice takes (every class can use
	// at most what is free).
	fallByRise fallBy = iota
	// fallByUnusable: of that capacity, what the classes that can use
	// the GPU could not; nor more than the GPU's fragmentation.
	fallByUnusable
	// fallByCell: the GPU's fragmentation.
	fallByCell
	// fallByWhole: a whole GPU.
	fallByWhole
)

// fallRule decides the fallRule of pod on this node.
func (s *NodeFigures) fallRule(pod PodDemand, opts FitOptions) fallRule {
	measured := s.fragWorkload != nil && opts.Workload == s.fragWorkload
	r := fallRule{by: fallByRise, limit: math.Inf(1)}
	if measured {
		// Fragmentation is never below 0: no pod lowers it by more than
		// it is.
		r.limit = s.fragBefore
	}
	switch unbounded := s.unboundedAfter(pod, opts.Workload, measured); {
	case !unbounded:
		// A host that bounds what some classes can use gives them a
		// share of each GPU that grows as GPUs drop out of their reach:
		// the slice may then lower fragmentation by more than it takes.
		r.by = fallByWhole
	case opts.Workload != nil && opts.Workload.fill != nil:
		// Counting expected fills, a slice may leave its GPU's free
		// share worth more than before (0.41 that slices fill well, from
		// 0.88 that none does): up to all of the GPU's free share, or,
		// measured, of its fragmentation.
		r.by = fallByWhole
		if measured {
			r.by = fallByCell
		}
	case measured:
		r.by = fallByUnusable
	}
	return r
}

// fall is how far a slice that raises its GPU's used share by rise can
// lower the node's fragmentation, when the share of the workload that
// cannot use that GPU's free capacity is at most unusable and the GPU
// holds at most cellFrag of the fragmentation.
func (r fallRule) fall(rise, unusable, cellFrag float64) float64 {
	switch r.by {
	case fallByWhole:
		rise = 1
	case fallByCell:
		rise = cellFrag
	case fallByUnusable:
		rise = min(rise*unusable, cellFrag)
	}
	return min(rise, r.limit)
}

// ScoreBoundByGPU narrows bound, the node's ScoreBound for pod, by reading
// the summary's cells, under a node policy that reads the node's
// fragmentation (PolicyFragmentation): to the most that one of the GPUs
// the slice fits on can lower the node's fragmentation by (its own rise
// of the used share, the share of the workload that cannot use it and the
// fragmentation it holds, where ScoreBound takes the most of each over all
// GPUs with a free slot). Under other policies, and on a node where the
// slice fits no GPU, it returns bound. It reads the GPUs' cells, so a
// scheduler asks it only of the nodes that ScoreBound could not leave out.
// Safe for concurrent use.
func (s *NodeSummary) ScoreBoundByGPU(pod PodDemand, opts FitOptions, bound NodeScore) NodeScore {
	r := rulesOf(resolve(pod.Constraints.NodePolicy, opts.NodePolicy))
	if !oneSlice(pod) || s.frag == nil || s.frag.masks == nil || !r.fragmentation {
		return bound
	}
	cr := pod.Request.Containers[0]
	split := s.inv.SplitCount
	rule := s.fallRule(pod, opts)
	fall, rises, fits := 0.0, 0.0, false
	for i := range s.cells {
		// quickFit's checks of whether the slice fits the GPU.
		c := &s.cells[i]
		use := sliceUse(cr, c.schedulableMiB)
		if c.exclusive != 0 || c.slices+1 > split || use.MemoryMiB <= 0 ||
			c.memMiB+use.MemoryMiB > c.schedulableMiB || c.cores+use.CoresPercent > c.coresCap {
			continue
		}
		rise := shareOf(c.usage().add(use, 1), c.schedulableMiB, c.coresCap, split) - c.share
		fall, rises, fits = max(fall, rule.fall(rise, c.unusable, c.frag)), max(rises, rise), true
	}
	if !fits {
		return bound
	}
	healthy := float64(s.healthy)
	after := (s.usedBefore + rises) / healthy
	raw := r.rawBound(s.usedBefore/healthy, after, fall)
	return NodeScore{
		Value: min(bound.Value, boundValue(r.value(raw))),
		Raw:   min(bound.Raw, raw+rawSlack),
		Tie:   min(bound.Tie, r.tie(after)+rawSlack),
	}
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

// CannotReach reports whether no placement whose score is at or under s,
// a bound from ScoreBound or ScoreBoundByGPU, ties or beats best under
// Compare: its Value is lower, or its Raw lower by more than Compare's
// tolerance (and the bound's slack), or its Raw no higher (the bound's Raw
// leaves Compare's tolerance for rounding, so the placement's cannot be
// higher) and its Tie lower.
func (s NodeScore) CannotReach(best NodeScore) bool {
	return s.Value < best.Value || s.Raw < best.Raw-boundTolerance ||
		s.Raw <= best.Raw+scoreEpsilon && s.Tie < best.Tie-boundTolerance
}

// boundTolerance is how far below the best's a bound's Raw or Tie must be
// for CannotReach: far above Compare's tolerance and the bound's slack.
const boundTolerance = 1e-9

// rawSlack is what ScoreBound adds to the Raw and Tie it bounds: above
// the rounding error of summing a node's shares (about 1e-14 for the
// sums of a node's GPUs and a workload's shapes), and no more than
// NodeScore.Compare's tolerance, so that a node whose Raw bound is at
// most the best Raw found plus that tolerance cannot beat it, and ties
// it at best.
const rawSlack = scoreEpsilon

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

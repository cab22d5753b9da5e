package vgpu

import "math/bits"

// NodeSummary is one node laid out for many Fit calls: its inventory, what
// its pods hold on each GPU in inventory order, and what Fit measures the
// node by before a pod — its used capacity, and for one Workload its
// fragmentation and which request shapes each GPU can still take —
// computed once. Summarize builds it; it is never modified afterwards and
// is safe for concurrent use.
//
// A scheduler that asks about the same node for many pods (the extender's
// Filter and Prioritize over thousands of nodes) keeps one per node and
// builds a new one whenever the node's inventory or usage changes; Fit on
// it then does no map lookup and measures nothing about the node that does
// not depend on the pod. NodeSummary.Fit gives exactly what Fit gives for
// the same node: same placement, same figures, bit for bit.
type NodeSummary struct {
	// First what Reject and quickFit read, side by side.
	NodeFigures
	// w is the workload frag was measured against; frag is nil when w is
	// nil or has no classes.
	w    *Workload
	frag *fragSummary
	// cells are the healthy GPUs in inventory order, laid out for
	// quickFit.
	cells    []gpuCell
	hostFree *HostResources
	inv      NodeInventory
	// base is what the node's pods hold, by GPU position in inv.GPUs.
	base []GPUUsage
}

// gpuCell is one healthy GPU as quickFit reads it: what it offers, what
// the node's pods hold on it, and its used share, side by side.
type gpuCell struct {
	gi int
	// model is the position of the first GPU of the node with this GPU's
	// model, so that cells compare models without reading the inventory.
	model                  int
	schedulableMiB, memMiB int64
	cores, coresCap        int
	slices, exclusive      int
	share                  float64
	// mask is the shapes of the summary's workload that can take a slice
	// of the GPU (fragSummary.masks), for quickFit's fragmentation deltas.
	mask uint64
	// fill and admitted are the summary's workload's fill table for the
	// GPU and the weight of its shapes that the GPU's model admits
	// (fragModel.valueAt), when fragSummary.fill.
	fill     []float64
	admitted float64
	// unusable and frag are, for a GPU with a free slot, the share of
	// the summary's workload that cannot use its free capacity and the
	// fragmentation it holds (NodeFigures.maxUnusable and maxCellFrag
	// over one GPU), for ScoreBoundByGPU.
	unusable, frag float64
}

// fragSummary is the node's fragmentation before a pod, for one workload.
type fragSummary struct {
	// weight is the workload's weights (fragModel.weight) for a pod
	// without host requests; Fit calls build their model from it.
	weight [2]shapeWeights
	// free is each GPU's free capacity (0 for unhealthy GPUs) and masks
	// each GPU's usable shapes (bit si: shape si can take a slice of it),
	// by GPU position; masks is nil when the workload has more than 64
	// shapes.
	free  []float64
	masks []uint64
	// cnt and sum are fragModel.stats of the node without the pod, and
	// freeTotal its free capacity.
	cnt       []int
	sum       []float64
	freeTotal float64
	// before is the node's fragmentation (Placement.FragmentationBefore).
	before float64
	// fill and lambda are fragModel's.
	fill   bool
	lambda float64
}

// summaryBlock holds a NodeSummary of up to blockGPUs GPUs, measured
// against a workload of up to blockShapes shapes, in one allocation:
// Filter reads thousands of summaries once each, and the parts of one
// summary then come from neighbouring memory rather than from pointers
// followed one after another. Larger nodes and workloads take the parts
// that do not fit from the heap.
type summaryBlock struct {
	// In the order quickFit reads them; what only Fit reads last.
	s     NodeSummary
	f     fragSummary
	cells [blockGPUs]gpuCell
	cnt   [blockShapes]int
	sum   [blockShapes]float64
	full  [2][blockShapes]float64
	base  [blockGPUs]GPUUsage
	free  [blockGPUs]float64
	masks [blockGPUs]uint64
}

const (
	blockGPUs   = 8
	blockShapes = 16
)

// inBlock returns buf[:n] when it has room, else a new slice of n.
func inBlock[T any](buf []T, n int) []T {
	if n <= len(buf) {
		return buf[:n:n]
	}
	return make([]T, n)
}

// Summarize returns the summary of node, measured against w for the
// fragmentation policy (nil: none; NodeSummary.Fit with another workload
// still works, measuring the node per call as Fit does). It only reads its
// arguments.
func Summarize(node NodeState, w *Workload) *NodeSummary {
	st := newFitState(PodRequest{}, node.Inventory, node.Usage)
	b := &summaryBlock{}
	gpus := len(node.Inventory.GPUs)
	s := &b.s
	*s = NodeSummary{
		inv: node.Inventory, hostFree: node.HostFree, base: inBlock(b.base[:], len(st.base)), w: w,
		NodeFigures: NodeFigures{healthy: st.healthy, hostKnown: node.HostFree != nil, gpus: gpus},
	}
	if node.HostFree != nil {
		s.host = *node.HostFree
	}
	copy(s.base, st.base)
	base := s.base
	s.cells = inBlock(b.cells[:], st.healthy)[:0]
	s.largestFreeMiB = -1
	for gi := range s.inv.GPUs {
		g := &s.inv.GPUs[gi]
		if g.Health != Healthy {
			continue
		}
		u := base[gi]
		model := gi
		for _, c := range s.cells {
			if s.inv.GPUs[c.gi].Model == g.Model {
				model = c.model
				break
			}
		}
		s.cells = append(s.cells, gpuCell{
			gi: gi, model: model, schedulableMiB: g.SchedulableMemoryMiB, memMiB: u.MemoryMiB,
			cores: u.CoresPercent, coresCap: g.CoresPercent, slices: u.Slices, exclusive: u.Exclusive,
			share: usedShare(g, u, s.inv.SplitCount),
		})
		if u.Exclusive == 0 && u.Slices < s.inv.SplitCount {
			s.sliceable++
			s.largestFreeMiB = max(s.largestFreeMiB, g.SchedulableMemoryMiB-u.MemoryMiB)
			s.boundGPU(g, u)
		}
	}
	st.baseOnly = true
	s.usedBefore = st.used()
	if w == nil || w.total <= 0 {
		return s
	}
	shapes := len(w.shapes)
	m := &fragModel{w: w, cnt: inBlock(b.cnt[:], shapes), sum: inBlock(b.sum[:], shapes)}
	m.weight[0].full, m.weight[1].full = inBlock(b.full[0][:], shapes), inBlock(b.full[1][:], shapes)
	w.fillWeights(node.HostFree, HostResources{}, gpus, &m.weight[0], &m.weight[1])
	f := &b.f
	f.free = inBlock(b.free[:], gpus)
	if shapes <= 64 {
		f.masks = inBlock(b.masks[:], gpus)
	}
	for gi := range s.inv.GPUs {
		g := &s.inv.GPUs[gi]
		if g.Health != Healthy {
			continue
		}
		f.free[gi] = 1 - usedShare(g, base[gi], s.inv.SplitCount)
		if f.masks == nil {
			continue
		}
		for si := range w.shapes {
			if usable(&w.shapes[si], g, base[gi], s.inv.SplitCount) {
				f.masks[gi] |= 1 << si
			}
		}
	}
	m.setFill(node.HostFree, st.freeBefore())
	f.fill, f.lambda = m.fill, m.lambda
	st.env.frag = m
	f.freeTotal = m.stats(st).free
	f.before = m.measure(f.freeTotal, &m.weight[0])
	// m's stats are rank's for a pod that holds nothing yet.
	f.cnt, f.sum = m.cnt, m.sum
	f.weight = m.weight
	s.frag = f
	for i := range s.cells {
		c := &s.cells[i]
		if f.masks != nil {
			c.mask = f.masks[c.gi]
		}
		if f.fill {
			g := &s.inv.GPUs[c.gi]
			c.fill, c.admitted = w.fillFor(g), w.admittedFull(g)
		}
	}
	s.boundFragmentation(w, f)
	return s
}

// Fit is vgpu.Fit on the summarized node: Fit(pod, NodeState{Inventory,
// Usage, HostFree of the node summarized}, opts), with the same result.
// Safe for concurrent use.
func (s *NodeSummary) Fit(pod PodDemand, opts FitOptions) (Placement, error) {
	if p, err, ok := s.quickFit(pod, opts); ok {
		return p, err
	}
	var buf fitBuffers
	state := initFitStateFrom(pod.Request, s.inv, s.base, s.healthy, &buf)
	env := fitEnv{hostFree: s.hostFree, summary: s}
	state.env = &env
	return fitOn(pod, &state, s.inv.Node, opts)
}

// quickFit is Fit for the commonest pod — one app container, one slice of
// one GPU, no model or UUID filter — read from the summary's cells rather
// than the inventory, with the same result to the bit. ok is false when it
// cannot answer: another pod, another workload for the fragmentation
// policy, or a failure that needs Fit's message.
func (s *NodeSummary) quickFit(pod PodDemand, opts FitOptions) (p Placement, err error, ok bool) {
	if !oneSlice(pod) {
		return Placement{}, nil, false
	}
	cr, c := pod.Request.Containers[0], pod.Constraints
	p = Placement{
		Allocation:  PodAllocation{Node: s.inv.Node},
		NodePolicy:  resolve(c.NodePolicy, opts.NodePolicy),
		GPUPolicy:   resolve(c.GPUPolicy, opts.GPUPolicy),
		HealthyGPUs: s.healthy,
	}
	node, gpu := rulesOf(p.NodePolicy), rulesOf(p.GPUPolicy)
	frag := node.fragmentation || gpu.fragmentation
	if frag && (s.frag == nil || opts.Workload != s.w || s.frag.masks == nil) {
		return Placement{}, nil, false
	}
	// The workload's weights after the pod: the summary's, unless the
	// pod's host requests change what the host leaves its classes.
	weight := [2]shapeWeights{}
	var afterBuf [16]float64
	if frag {
		weight = s.frag.weight
		if s.hostFree != nil && pod.Host != (HostResources{}) {
			var after shapeWeights
			if n := len(s.w.shapes); n <= len(afterBuf) {
				after.full = afterBuf[:n]
			} else {
				after.full = make([]float64, n)
			}
			s.w.fillWeights(s.hostFree, pod.Host, len(s.inv.GPUs), nil, &after)
			weight[1] = after
		}
	}
	// The filters of fitState.choose and check, in their order.
	split := s.inv.SplitCount
	var f filterCounts
	f.healthy, f.model, f.uuid = s.healthy, s.healthy, s.healthy
	best := -1
	var bestKey, bestUsed, bestDelta float64
	var bestUse GPUUsage
	// seen are cells whose delta is known, seenDelta their deltas.
	var seen [8]int
	var seenDelta [8]float64
	nSeen := 0
	for i := range s.cells {
		cell := &s.cells[i]
		use := sliceUse(cr, cell.schedulableMiB)
		if cell.exclusive != 0 || cell.slices+1 > split {
			continue
		}
		f.slices++
		if use.MemoryMiB <= 0 || cell.memMiB+use.MemoryMiB > cell.schedulableMiB {
			continue
		}
		f.memory++
		if cell.cores+use.CoresPercent > cell.coresCap {
			continue
		}
		if gpu.inOrder {
			// The first GPU that fits, as fitState.rank leaves them.
			best, bestUse = i, use
			break
		}
		// fitState.rank's key; ties go to the fuller GPU, then the lower
		// position, as its stable sort does.
		var delta float64
		if gpu.fragmentation {
			// GPUs alike (same model, offer and holdings; often all the
			// untouched GPUs of a node) change fragmentation alike.
			if j := s.alike(i, seen[:nSeen]); j >= 0 {
				delta = seenDelta[j]
			} else {
				delta = s.cellDelta(cell, use, &weight[1])
				if nSeen < len(seen) {
					seen[nSeen], seenDelta[nSeen] = i, delta
					nSeen++
				}
			}
		}
		key := gpu.gpuKey(cell.share, delta)
		if best < 0 || key < bestKey || key == bestKey && cell.share > bestUsed {
			best, bestKey, bestUsed, bestUse, bestDelta = i, key, cell.share, use, delta
		}
	}
	if best < 0 {
		if !opts.ReasonOnly {
			return Placement{}, nil, false // Fit words the message
		}
		reason := f.reason(1)
		if f.slices >= 1 && f.memory >= 1 {
			reason = ReasonInsufficientCores
		}
		return Placement{}, &FitError{Reason: reason, Container: 0}, true
	}
	chosen := &s.cells[best]
	if !opts.NoAllocation {
		p.Allocation.Containers = []ContainerAllocation{{Name: cr.Name, GPUs: []GPUSlice{{
			UUID: s.inv.GPUs[chosen.gi].UUID, MemoryMiB: bestUse.MemoryMiB, CoresPercent: bestUse.CoresPercent,
		}}}}
	}
	if opts.Unscored {
		return p, nil, true
	}
	// fitState.measure: the used capacity summed in GPU order, the chosen
	// GPU holding the slice too.
	for i := range s.cells {
		cell := &s.cells[i]
		if i != best {
			p.UsedAfter += cell.share
			continue
		}
		p.UsedAfter += shareOf(cell.usage().add(bestUse, 1), cell.schedulableMiB, cell.coresCap, split)
	}
	p.UsedBefore = s.usedBefore
	if node.fragmentation {
		// fitState.fragmentation for a pod that changes one GPU.
		if !gpu.fragmentation {
			bestDelta = s.cellDelta(chosen, bestUse, &weight[1])
		}
		m := fragModel{w: s.w, cnt: s.frag.cnt, sum: s.frag.sum}
		p.FragmentationAfter = m.measure(s.frag.freeTotal, &weight[1]) + bestDelta
		p.FragmentationBefore = s.frag.before
	}
	return p, nil, true
}

// cellDelta is fragModel.delta for cell taking the slice use, weighed by
// weight, read from the cell alone, to the bit: a shape that cannot take a
// slice of the GPU before cannot after either, so only the shapes of its
// mask can change the measure.
func (s *NodeSummary) cellDelta(cell *gpuCell, use GPUUsage, weight *shapeWeights) float64 {
	split := s.inv.SplitCount
	after := cell.usage().add(use, 1)
	free0 := 1 - cell.share // fragSummary.free
	free1 := 1 - shareOf(after, cell.schedulableMiB, cell.coresCap, split)
	f := s.frag
	// joined is the shapes that can use the GPU after. The mask says a
	// shape could before, so its model passes and only the capacity after
	// is left to check.
	var joined uint64
	for mask := cell.mask; mask != 0 && free1 > 0; mask &= mask - 1 {
		si := bits.TrailingZeros64(mask)
		if t := &s.w.shapes[si]; t.GPUs == 0 || shapeFits(t, cell.schedulableMiB, cell.coresCap, after, split) {
			joined |= 1 << si
		}
	}
	value0, value1 := free0, free1
	if f.fill {
		// fragModel.value, with the cell's fill table and the weights of
		// the shapes that can use the GPU summed from the masks.
		m := fragModel{w: s.w, fill: f.fill, lambda: f.lambda}
		if free0 > 0 && cell.usage() != (GPUUsage{}) {
			value0 = m.valueAt(cell.fill, cell.admitted, free0, s.w.fullOf(cell.mask))
		}
		if free1 > 0 && after != (GPUUsage{}) {
			value1 = m.valueAt(cell.fill, cell.admitted, free1, s.w.fullOf(joined))
		}
	}
	var d float64
	for mask := cell.mask; mask != 0; mask &= mask - 1 {
		si := bits.TrailingZeros64(mask)
		t := &s.w.shapes[si]
		d -= weight.usableChange(t, si, f.cnt[si], f.sum[si], value0, free0 > 0, value1, joined&(1<<si) != 0)
	}
	return d + (free1 - free0)
}

// usage is what the node's pods hold on the cell's GPU.
func (c *gpuCell) usage() GPUUsage {
	return GPUUsage{MemoryMiB: c.memMiB, CoresPercent: c.cores, Slices: c.slices, Exclusive: c.exclusive}
}

// alike returns the position in seen of a cell that is alike cell i (same
// model, memory, cores and holdings: the cell holds all of a GPUUsage), or
// -1.
func (s *NodeSummary) alike(i int, seen []int) int {
	a := &s.cells[i]
	for k, j := range seen {
		b := &s.cells[j]
		if a.model == b.model && a.schedulableMiB == b.schedulableMiB && a.memMiB == b.memMiB && a.cores == b.cores &&
			a.coresCap == b.coresCap && a.slices == b.slices && a.exclusive == b.exclusive {
			return k
		}
	}
	return -1
}

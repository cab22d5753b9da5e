package vgpu

import "slices"

// Reason is why a pod does not fit a node, one constant per cause so that
// callers can count rejections by reason.
type Reason string

const (
	// ReasonUnhealthy means the node has fewer healthy GPUs than a container
	// asks for (or none at all).
	ReasonUnhealthy Reason = "NotEnoughHealthyGPUs"
	// ReasonModel means too few healthy GPUs pass the model filter.
	ReasonModel Reason = "GPUModel"
	// ReasonUUID means too few healthy GPUs of the right model pass the UUID
	// filter.
	ReasonUUID Reason = "GPUUUID"
	// ReasonNoFreeSlice means too few admitted GPUs have a free slice (at most
	// NodeInventory.SplitCount slices per GPU; a whole-GPU container needs
	// an untouched GPU).
	ReasonNoFreeSlice Reason = "NoFreeSlice"
	// ReasonInsufficientMemory means too few GPUs with a free slice have the
	// memory a slice needs.
	ReasonInsufficientMemory Reason = "InsufficientMemory"
	// ReasonInsufficientCores means too few GPUs with a free slice and memory
	// have the compute a slice reserves.
	ReasonInsufficientCores Reason = "InsufficientCores"
	// ReasonNUMA means enough GPUs fit, but no NUMA node has enough of them for
	// a container that asked for NUMA binding.
	ReasonNUMA Reason = "NUMA"
	// ReasonEnforcement means the pod asks for its slices to be enforced
	// (AnnotationEnforcement) and the node's mechanism does not guard one
	// of its containers.
	ReasonEnforcement Reason = "Enforcement"
)

// FitError says why a pod does not fit a node. Fit returns it as the only
// error type; callers read it with errors.As.
type FitError struct {
	// Reason is the cause, for counting.
	Reason Reason
	// Container is the position in PodRequest.Containers of the container
	// that does not fit.
	Container int
	// Message says what was needed and what the node has, in words a user
	// can act on, e.g. "insufficient memory: needs 20480 MiB, largest free
	// 16384 MiB on GPU-1". It names the container when the pod has more
	// than one asking for GPUs. Empty with FitOptions.ReasonOnly.
	Message string
}

// Error returns the message, or the reason when there is none.
func (e *FitError) Error() string {
	if e.Message == "" {
		return string(e.Reason)
	}
	return e.Message
}

// Fit finds GPUs on node for every container of pod.Request, given what
// the pods already on the node hold and pod.Constraints. Each container
// gets GPUs distinct from each other; every GPU must be Healthy, pass the
// model and UUID filters, have a free slice (at most SplitCount per GPU;
// whole-GPU containers need an untouched GPU and take all its slices), the
// slice's memory (MemoryMiB, or MemoryPercent of the GPU's
// SchedulableMemoryMiB rounded down; whole-GPU containers take all of it)
// and its compute (CoresPercent, counted against the GPU's CoresPercent; 0
// reserves none). With NUMABind, all GPUs of a container share a NUMA
// node. A pod that asks for enforcement (Constraints.Enforcement) fits
// only a node whose mechanism guards each of its containers. The pod's
// containers are counted by phase, as NodeUsage describes:
// regular init containers may reuse what the app containers hold.
//
// Among GPUs that fit, the GPU policy picks (binpack: most used first;
// spread: least used first; fragmentation: least increase of
// Fragmentation first, then most used; PolicyFirstFit: inventory order);
// remaining ties go to the lower position in node.Inventory.GPUs (Index
// order). A container with ContainerRequest.UUIDs takes only those GPUs. Containers are placed one
// at a time, sidecars and app containers first in request order, then
// regular init containers; Fit does not backtrack, so a pod whose
// containers fit only in another arrangement is reported as not fitting.
//
// On failure it returns a zero Placement and a *FitError about the first
// container that does not fit. A pod that asks for no GPU fits any node
// with an allocation without containers. Fit is pure, deterministic and
// safe to call concurrently; it does not modify its arguments.
func Fit(pod PodDemand, node NodeState, opts FitOptions) (Placement, error) {
	var buf fitBuffers
	state := initFitState(pod.Request, node.Inventory, node.Usage, &buf)
	env := fitEnv{hostFree: node.HostFree}
	state.env = &env
	return fitOn(pod, &state, node.Inventory.Node, opts)
}

// fitOn is Fit on the node of s, named node, which holds what other pods
// hold there (and, from NodeSummary.Fit, the summary's figures). The name
// comes apart from s so that the result points to nothing s does, and the
// buffers s uses can stay on the caller's stack.
func fitOn(pod PodDemand, s *fitState, node string, opts FitOptions) (Placement, error) {
	req, c := pod.Request, pod.Constraints
	p := Placement{
		Allocation: PodAllocation{Node: node},
		NodePolicy: resolve(c.NodePolicy, opts.NodePolicy),
		GPUPolicy:  resolve(c.GPUPolicy, opts.GPUPolicy),
	}
	s.env.workload, s.podHost, s.reasonOnly = opts.Workload, pod.Host, opts.ReasonOnly
	p.HealthyGPUs = s.healthy
	nodeRules, gpuRules := rulesOf(p.NodePolicy), rulesOf(p.GPUPolicy)
	if len(req.Containers) == 0 {
		if !opts.Unscored {
			s.measure(&p, nodeRules)
			s.cpuSurplus(&p)
		}
		return p, nil
	}
	// chosen[ci] is where container ci's GPUs are in s.picks: positions,
	// not slices, so that nothing here points into the buffers.
	var chosenBuf [8]span
	chosen := chosenBuf[:0]
	if len(req.Containers) > len(chosenBuf) {
		chosen = make([]span, 0, len(req.Containers))
	}
	chosen = chosen[:len(req.Containers)]
	if err := s.checkEnforcement(c.Enforcement); err != nil {
		return Placement{}, err
	}
	// Sidecars and app containers first, then regular init containers.
	app := s.ph.count - 1
	for _, appPhase := range []bool{true, false} {
		for ci := range req.Containers {
			if s.ph.in(ci, app) != appPhase {
				continue
			}
			from := len(s.picks)
			if err := s.choose(ci, c, gpuRules); err != nil {
				return Placement{}, err
			}
			chosen[ci] = span{from, len(s.picks)}
		}
	}
	if opts.NoAllocation {
		if !opts.Unscored {
			s.measure(&p, nodeRules)
		}
		return p, nil
	}
	slicesTotal := 0
	for _, sp := range chosen {
		slicesTotal += sp.to - sp.from
	}
	all := make([]GPUSlice, slicesTotal)
	p.Allocation.Containers = make([]ContainerAllocation, len(req.Containers))
	for ci, cr := range req.Containers {
		gpus := s.picks[chosen[ci].from:chosen[ci].to]
		ca := ContainerAllocation{Name: cr.Name, Init: cr.Init, GPUs: all[:len(gpus):len(gpus)]}
		all = all[len(gpus):]
		for k, gi := range gpus {
			use := s.need(ci, gi)
			ca.GPUs[k] = GPUSlice{UUID: s.node.GPUs[gi].UUID, MemoryMiB: use.MemoryMiB, CoresPercent: use.CoresPercent}
		}
		p.Allocation.Containers[ci] = ca
	}
	if !opts.Unscored {
		s.measure(&p, nodeRules)
	}
	return p, nil
}

// span is a range of positions in a slice, from included, to excluded.
type span struct{ from, to int }

// measure fills p's Used figures, and its Fragmentation figures when node
// (p.NodePolicy's rules) reads them, from the node without and with the
// pod. It runs only once the pod fits, so nodes that reject it cost no
// more than the filters.
func (s *fitState) measure(p *Placement, node *policyRules) {
	p.UsedAfter = s.used()
	if s.env.summary != nil {
		p.UsedBefore = s.env.summary.usedBefore
	} else {
		s.baseOnly = true
		p.UsedBefore = s.used()
		s.baseOnly = false
	}
	if node.fragmentation {
		p.FragmentationBefore, p.FragmentationAfter = s.fragmentation()
	}
}

// fragmentation returns the node's fragmentation without and with the
// pod: for a pod that changes one GPU, from the node's stats without it
// and the change on that GPU (fragModel.afterOne), else by measuring the
// node with it. The summary's figures stand for the node without the pod
// when they hold for this call.
func (s *fitState) fragmentation() (before, after float64) {
	m := s.fragModel()
	if m.w.total <= 0 {
		return 0, 0
	}
	cached := s.fragCached()
	gi := s.onlyChanged()
	if gi < 0 {
		after = m.node(s, true)
		if cached {
			return s.env.summary.frag.before, after
		}
		s.baseOnly = true
		before = m.node(s, false)
		s.baseOnly = false
		return before, after
	}
	var free float64
	if cached {
		f := s.env.summary.frag
		copy(m.cnt, f.cnt)
		copy(m.sum, f.sum)
		free, before = f.freeTotal, f.before
	} else {
		s.baseOnly = true
		free = m.stats(s).free
		s.baseOnly = false
		before = m.measure(free, &m.weight[0])
	}
	return before, m.afterOne(s, free, gi, s.base[gi], s.total(gi))
}

// onlyChanged returns the position of the one GPU the pod holds anything
// on, or -1 when it holds something on none or on several.
func (s *fitState) onlyChanged() int {
	changed := -1
	for gi := range s.node.GPUs {
		if s.untouched(gi) {
			continue
		}
		if changed >= 0 {
			return -1
		}
		changed = gi
	}
	return changed
}

// cpuSurplus fills p's CPU surplus for a pod without GPUs on a node whose
// free host CPU is known (Placement.CPUSurplusMilli).
func (s *fitState) cpuSurplus(p *Placement) {
	if s.env.hostFree == nil {
		return
	}
	w := s.env.workload
	if w == nil {
		w = DefaultWorkload()
	}
	p.HasCPUSurplus = true
	p.CPUSurplusMilli = float64(s.env.hostFree.CPUMilli-s.podHost.CPUMilli) - (float64(p.HealthyGPUs)-p.UsedAfter)*w.CPUPerGPU()
}

// fragModel returns the fragmentation model of this call, built on first
// use: from the summary's weights when they hold for this call (same
// workload, a pod without host requests), else anew.
func (s *fitState) fragModel() *fragModel {
	if s.env.frag != nil {
		return s.env.frag
	}
	if s.fragCached() && s.podHost == (HostResources{}) {
		m := &fragModel{w: s.env.summary.w, weight: s.env.summary.frag.weight,
			fill: s.env.summary.frag.fill, lambda: s.env.summary.frag.lambda}
		n := len(m.w.shapes)
		if n <= len(m.cntBuf) {
			m.cnt, m.sum = m.cntBuf[:n], m.sumBuf[:n]
		} else {
			m.cnt, m.sum = make([]int, n), make([]float64, n)
		}
		s.env.frag = m
		return s.env.frag
	}
	w := s.env.workload
	if w == nil {
		w = DefaultWorkload()
	}
	s.env.frag = newFragModel(w, s.env.hostFree, s.podHost, len(s.node.GPUs))
	s.env.frag.setFill(s.env.hostFree, s.freeBefore())
	return s.env.frag
}

// fragCached reports whether the summary's fragmentation figures hold for
// this call's workload.
func (s *fitState) fragCached() bool {
	return s.env.summary != nil && s.env.summary.frag != nil && s.env.workload == s.env.summary.w
}

// untouched reports whether the pod holds nothing on gi yet.
func (s *fitState) untouched(gi int) bool {
	n := len(s.node.GPUs)
	for p := range s.ph.count {
		if s.own[p*n+gi] != (GPUUsage{}) {
			return false
		}
	}
	return true
}

func resolve(pod, global Policy) Policy {
	switch {
	case pod != "":
		return pod
	case global != "":
		return global
	}
	return PolicyBinpack
}

// fitState is the working state of one Fit call: per GPU what other pods
// hold (base) and what this pod holds in each phase (own).
type fitState struct {
	req     PodRequest
	node    NodeInventory
	ph      phases
	base    []GPUUsage // by GPU position in node.GPUs
	own     []GPUUsage // own[p*len(GPUs)+gi]
	healthy int
	// baseOnly makes total ignore the pod, to measure the node before it.
	baseOnly bool
	// env holds what the call points to outside its buffers; podHost
	// feeds env.frag.
	env     *fitEnv
	podHost HostResources
	// reasonOnly leaves FitError messages empty (FitOptions.ReasonOnly).
	reasonOnly bool
	// scratch buffers reused across containers.
	cands []candidate
	picks []int
}

// fitEnv is what a Fit call points to besides its buffers, kept apart so
// that the buffers can stay on the caller's stack: the fragmentation model
// goes to the heap, and whatever the state points to directly would go
// with it.
type fitEnv struct {
	// workload and hostFree feed frag, built on first use.
	workload *Workload
	hostFree *HostResources
	frag     *fragModel
	// summary, when set, is the summarized node (NodeSummary.Fit): base
	// came from it, and its figures stand in for measuring the node
	// without the pod.
	summary *NodeSummary
}

// fitBuffers is storage a caller may keep on its stack so that small nodes
// and pods cost no allocation.
type fitBuffers struct {
	usages [24]GPUUsage
	cands  [16]candidate
	picks  [16]int
	masks  [8]uint64
}

type candidate struct {
	gi   int
	key  float64 // the GPU policy's gpuKey, lower is better
	used float64
}

func newFitState(req PodRequest, node NodeInventory, usage *NodeUsage) *fitState {
	s := initFitState(req, node, usage, &fitBuffers{})
	s.env = &fitEnv{}
	return &s
}

// initFitState returns the state of one Fit call, using buf where it has
// room. It returns a value so that callers can keep it on their stack.
func initFitState(req PodRequest, node NodeInventory, usage *NodeUsage, buf *fitBuffers) fitState {
	s := initFitStateFrom(req, node, nil, 0, buf)
	for i := range node.GPUs {
		if node.GPUs[i].Health == Healthy {
			s.healthy++
		}
		if usage != nil && len(usage.gpus) > 0 {
			s.base[i] = usage.gpus[node.GPUs[i].UUID]
		}
	}
	return s
}

// initFitStateFrom is initFitState with the other pods' usage given by GPU
// position (base, copied; nil means none) and the healthy GPU count.
func initFitStateFrom(req PodRequest, node NodeInventory, base []GPUUsage, healthy int, buf *fitBuffers) fitState {
	g := len(node.GPUs)
	s := fitState{req: req, node: node, healthy: healthy}
	s.ph = newPhases(req.Containers, buf.masks[:0])
	var usages []GPUUsage
	if n := g * (1 + s.ph.count); n <= len(buf.usages) {
		usages = buf.usages[:n]
	} else {
		usages = make([]GPUUsage, n)
	}
	s.base, s.own = usages[:g:g], usages[g:]
	copy(s.base, base)
	// Both are filled by reslicing within capacity, never by append, so
	// that buf can stay on the caller's stack: at most one candidate per
	// GPU, at most the pod's GPUs picked.
	if g <= len(buf.cands) {
		s.cands = buf.cands[:0]
	} else {
		s.cands = make([]candidate, 0, g)
	}
	picks := 0
	for _, c := range req.Containers {
		picks += max(c.GPUs, 0)
	}
	if picks <= len(buf.picks) {
		s.picks = buf.picks[:0]
	} else {
		s.picks = make([]int, 0, picks)
	}
	return s
}

// need is what container ci holds on GPU gi.
func (s *fitState) need(ci, gi int) GPUUsage {
	cr := s.req.Containers[ci]
	g := &s.node.GPUs[gi]
	use := sliceUse(cr, g.SchedulableMemoryMiB)
	if cr.Exclusive {
		use.MemoryMiB, use.Exclusive = g.SchedulableMemoryMiB, 1
	}
	return use
}

// sliceUse is what a shared slice of container cr holds on a GPU offering
// schedulableMiB: its memory in MiB, or its share of that memory.
func sliceUse(cr ContainerRequest, schedulableMiB int64) GPUUsage {
	use := GPUUsage{MemoryMiB: cr.MemoryMiB, CoresPercent: cr.CoresPercent, Slices: 1}
	if cr.MemoryMiB == 0 {
		use.MemoryMiB = schedulableMiB * int64(cr.MemoryPercent) / MaxPercent
	}
	return use
}

// peak is what the pod holds on gi (the max over phases), plus add in the
// phases of container ci when ci >= 0.
func (s *fitState) peak(gi, ci int, add GPUUsage) GPUUsage {
	var out GPUUsage
	n := len(s.node.GPUs)
	for p := range s.ph.count {
		u := s.own[p*n+gi]
		if ci >= 0 && s.ph.in(ci, p) {
			u = u.add(add, 1)
		}
		out = out.max(u)
	}
	return out
}

// total is what gi holds with the pod as placed so far.
func (s *fitState) total(gi int) GPUUsage {
	if s.baseOnly {
		return s.base[gi]
	}
	return s.base[gi].add(s.peak(gi, -1, GPUUsage{}), 1)
}

// check reports which of slices, memory and cores let container ci take a
// slice of gi.
func (s *fitState) check(ci, gi int) (slicesOK, memOK, coresOK bool) {
	g := &s.node.GPUs[gi]
	use := s.need(ci, gi)
	n := len(s.node.GPUs)
	ownFree := true
	for p := range s.ph.count {
		if !s.ph.in(ci, p) {
			continue
		}
		if u := s.own[p*n+gi]; u.Exclusive > 0 || (use.Exclusive > 0 && u != (GPUUsage{})) {
			ownFree = false
		}
	}
	b := s.base[gi]
	t := b.add(s.peak(gi, ci, use), 1)
	if use.Exclusive > 0 {
		slicesOK = ownFree && b == (GPUUsage{})
	} else {
		slicesOK = ownFree && b.Exclusive == 0 && t.Slices <= s.node.SplitCount
	}
	memOK = use.MemoryMiB > 0 && t.MemoryMiB <= g.SchedulableMemoryMiB
	coresOK = t.CoresPercent <= g.CoresPercent
	return slicesOK, memOK, coresOK
}

// used returns the healthy capacity in use, in GPUs.
func (s *fitState) used() float64 {
	var sum float64
	for gi := range s.node.GPUs {
		if s.node.GPUs[gi].Health == Healthy {
			sum += usedShare(&s.node.GPUs[gi], s.total(gi), s.node.SplitCount)
		}
	}
	return sum
}

// usedShare is the share of g that u holds, 0 to 1: the larger of the
// memory and compute shares, and 1 when no slice is free.
func usedShare(g *GPU, u GPUUsage, split int) float64 {
	return shareOf(u, g.SchedulableMemoryMiB, g.CoresPercent, split)
}

// shareOf is usedShare of a GPU offering schedulableMiB and coresCap.
func shareOf(u GPUUsage, schedulableMiB int64, coresCap, split int) float64 {
	if u.Exclusive > 0 || u.Slices >= split || schedulableMiB <= 0 {
		return 1
	}
	share := float64(u.MemoryMiB) / float64(schedulableMiB)
	if coresCap > 0 {
		share = max(share, float64(u.CoresPercent)/float64(coresCap))
	}
	return min(share, 1)
}

// choose picks the GPUs of container ci under the GPU policy's rules gpu,
// appends them to s.picks and records them in s.own.
func (s *fitState) choose(ci int, c Constraints, gpu *policyRules) error {
	cr := s.req.Containers[ci]
	k := cr.GPUs
	f := filterCounts{}
	s.cands = s.cands[:0]
	for gi := range s.node.GPUs {
		g := &s.node.GPUs[gi]
		if g.Health != Healthy {
			continue
		}
		f.healthy++
		modelOK, uuidOK := c.admits(g)
		uuidOK = uuidOK && cr.admitsUUID(g.UUID)
		if !modelOK {
			continue
		}
		f.model++
		if !uuidOK {
			continue
		}
		f.uuid++
		slicesOK, memOK, coresOK := s.check(ci, gi)
		if !slicesOK {
			continue
		}
		f.slices++
		if !memOK {
			continue
		}
		f.memory++
		if !coresOK {
			continue
		}
		s.cands = s.cands[:len(s.cands)+1]
		s.cands[len(s.cands)-1] = candidate{gi: gi}
	}
	if len(s.cands) < k {
		return s.explain(ci, c, f)
	}
	s.rank(ci, gpu)
	picked := s.pick(k, c.NUMABind)
	if picked == nil {
		return s.numaError(ci)
	}
	n := len(s.node.GPUs)
	for _, gi := range picked {
		use := s.need(ci, gi)
		for p := range s.ph.count {
			if s.ph.in(ci, p) {
				s.own[p*n+gi] = s.own[p*n+gi].add(use, 1)
			}
		}
	}
	return nil
}

// rank orders s.cands best first by gpu.gpuKey, for container ci; equal
// keys go to the fuller GPU, then the lower index. Under gpu.inOrder they
// stay in GPU order, as choose found them.
func (s *fitState) rank(ci int, gpu *policyRules) {
	if gpu.inOrder {
		return
	}
	if gpu.fragmentation {
		s.fragModel().stats(s)
	}
	for i := range s.cands {
		cd := &s.cands[i]
		before := s.total(cd.gi)
		cd.used = usedShare(&s.node.GPUs[cd.gi], before, s.node.SplitCount)
		var delta float64
		if gpu.fragmentation {
			after := s.base[cd.gi].add(s.peak(cd.gi, ci, s.need(ci, cd.gi)), 1)
			delta = s.env.frag.delta(s, cd.gi, before, after)
		}
		cd.key = gpu.gpuKey(cd.used, delta)
	}
	slices.SortStableFunc(s.cands, func(a, b candidate) int {
		switch {
		case a.key < b.key:
			return -1
		case a.key > b.key:
			return 1
		case a.used > b.used: // equal keys: fuller first
			return -1
		case a.used < b.used:
			return 1
		}
		return a.gi - b.gi
	})
}

// pushPick appends gi to s.picks within its capacity (see
// initFitStateFrom).
func (s *fitState) pushPick(gi int) {
	s.picks = s.picks[:len(s.picks)+1]
	s.picks[len(s.picks)-1] = gi
}

// pick returns the first k ranked candidates; with numa, the first k of
// the NUMA node of the best-ranked GPU whose NUMA node has k candidates,
// or nil when none has.
func (s *fitState) pick(k int, numa bool) []int {
	start := len(s.picks)
	if !numa || k == 1 {
		for _, cd := range s.cands[:k] {
			s.pushPick(cd.gi)
		}
		return s.picks[start:]
	}
	for _, lead := range s.cands {
		node := s.node.GPUs[lead.gi].NUMANode
		s.picks = s.picks[:start]
		for _, cd := range s.cands {
			if s.node.GPUs[cd.gi].NUMANode == node {
				s.pushPick(cd.gi)
				if len(s.picks)-start == k {
					return s.picks[start:]
				}
			}
		}
	}
	s.picks = s.picks[:start]
	return nil
}

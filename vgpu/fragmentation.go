package vgpu

import (
	"cmp"
	"math"
	"slices"
)

// Workload is a distribution of typical requests: the yardstick that
// PolicyFragmentation measures free GPU capacity against. Free capacity
// that typical requests cannot use is fragmented. Build one with
// NewWorkload or Add from the requests a cluster sees, or use
// DefaultWorkload. The zero value has no classes and sees every free GPU
// as usable (no fragmentation). Fit and Fragmentation only read it; Add
// must not run concurrently with them.
type Workload struct {
	classes []WorkloadClass
	// shapes are the distinct GPU parts of classes; shapeOf maps a class
	// to its shape. Fit works per shape, so classes that differ only in
	// host requests cost little.
	shapes  []WorkloadClass
	shapeOf []int
	total   float64
	// gpuDemand, gpuCPU and gpuMemory are the sums, over the classes with
	// GPUs, of their weights times their GPU demand (demandGPUs), their
	// CPU and their host memory, so the workload's CPU per GPU of demand
	// is gpuCPU/gpuDemand.
	gpuDemand, gpuCPU, gpuMemory float64
	// supply is the cluster's GPUs by model (SetSupply) and scale, per
	// shape, the cluster's GPUs over those the shape's model filter
	// admits (1 without supply; 0 when it admits none).
	supply map[string]int
	scale  []float64
	// halfLife is the pods after which a pod's weight has halved (0:
	// never); boost is the factor Add multiplies new weights by, growing
	// by 2 every halfLife pods, so that older weights count less.
	halfLife, boost float64
	// hostFitOnly is SetHostFitOnly's.
	hostFitOnly bool
	// rich is what fillWeights needs to see at once that a host leaves
	// every class all of a node's GPUs; refresh keeps it current.
	rich richHost
	// fill is, per GPU model ("" for any), the fill table (fill.go); nil
	// without a supply. adds counts the classes added, fillAt their count
	// when fill was learnt; building holds the learning back while
	// Snapshot copies classes.
	fill         map[string][]float64
	adds, fillAt int
	building     bool
	noFill       bool
	// otherCPU and otherMemory are the weighted CPU and host memory of
	// the pods without GPUs Add counted (hostFeedsAll).
	otherCPU, otherMemory float64
}

// richHost is a Workload's figures for hosts that bound no class: the
// classes' largest host requests, their largest GPU demand per GPU among
// those that request CPU or memory, and, per shape, the weights every such
// host gives (each class's share, summed in class order as fillWeights
// sums them), with the total they are shares of.
type richHost struct {
	maxHost HostResources
	perGPU  float64
	full    []float64
	total   float64
	// admitted is, per model of the supply, the weight (of full) of the
	// shapes whose model filter admits its GPUs (admittedFull).
	admitted map[string]float64
}

// refresh recomputes w.rich after a change to the classes, their weights
// or the supply.
func (w *Workload) refresh() {
	r := richHost{full: make([]float64, len(w.shapes))}
	for ci := range w.classes {
		c := &w.classes[ci]
		r.total += c.Weight * w.scale[w.shapeOf[ci]]
		r.maxHost.CPUMilli = max(r.maxHost.CPUMilli, c.Host.CPUMilli)
		r.maxHost.MemoryMiB = max(r.maxHost.MemoryMiB, c.Host.MemoryMiB)
		if c.GPUs > 0 && c.Host != (HostResources{}) {
			r.perGPU = max(r.perGPU, demandGPUs(c.GPUs, c.Exclusive, c.MemoryPercent, c.CoresPercent)/float64(c.GPUs))
		}
	}
	if r.total > 0 {
		for ci := range w.classes {
			c := &w.classes[ci]
			si := w.shapeOf[ci]
			r.full[si] += c.Weight * w.scale[si] / r.total
		}
	}
	if len(w.supply) > 0 {
		r.admitted = make(map[string]float64, len(w.supply))
		for m := range w.supply {
			r.admitted[m] = admittedOf(w.shapes, r.full, &GPU{Model: m})
		}
	}
	w.rich = r
	w.refreshFill()
}

// feedsAll reports whether a host with free, which feeds feeds GPUs of
// demand (hostFeeds), lets every class use all of a node's gpus GPUs:
// each class's pod fits it, and it feeds each class's GPUs at the
// workload's averages with a margin for rounding (gpuBound). When it does,
// the weights are w.rich.full.
func (w *Workload) feedsAll(free HostResources, feeds float64, gpus int) bool {
	r := &w.rich
	if free.CPUMilli < max(r.maxHost.CPUMilli, 0) || free.MemoryMiB < max(r.maxHost.MemoryMiB, 0) {
		return false
	}
	return w.hostFitOnly || r.perGPU == 0 || feeds >= float64(gpus)*r.perGPU*(1+1e-9)
}

// WorkloadClass is one request shape of a Workload: what one container
// asks for on each of its GPUs, as in ContainerRequest, plus the model
// filter and host requests of pods that ask for it, and how common it is.
type WorkloadClass struct {
	// GPUs is how many GPUs the container needs, each with this slice. 0
	// is a pod without GPUs, as the paper counts them: it uses no GPU
	// capacity, but a node whose host it no longer fits on has all its
	// free GPU capacity fragmented for it. Add makes no such class.
	GPUs int
	// MemoryMiB or MemoryPercent (of SchedulableMemoryMiB) is the slice's
	// memory; exactly one is above 0.
	MemoryMiB     int64
	MemoryPercent int
	// CoresPercent is the compute the slice reserves; 0 reserves none.
	CoresPercent int
	// Exclusive means whole, untouched GPUs.
	Exclusive bool
	// Models and ExcludeModels filter GPU models as in Constraints, each
	// within Constraints' limits: at most MaxListItems items of at most
	// MaxListItemLength bytes (AddClass drops a class beyond them).
	Models, ExcludeModels []string
	// Host is the CPU and memory such pods request; zero fits any host.
	Host HostResources
	// Weight is how common the class is, relative to the others, in pods
	// (Add adds 1 per pod); above 0.
	Weight float64
}

// NewWorkload returns a Workload of classes; classes equal but for Weight
// are merged, adding their weights. Classes with GPUs < 0, Weight <= 0 or a
// model filter beyond Constraints' limits are dropped.
func NewWorkload(classes ...WorkloadClass) *Workload {
	w := &Workload{}
	for _, c := range classes {
		w.AddClass(c)
	}
	return w
}

// DefaultWorkload is the Workload used when none is given: shaped after the
// GPU tasks of Alibaba's 2023 GPU-sharing trace (about 55% whole single
// GPUs, 1% multi-GPU, 44% shared slices of 10% to 80% of a GPU's memory,
// reserving no compute), without host requests. Each call returns a new
// value.
func DefaultWorkload() *Workload {
	share := func(percent int, weight float64) WorkloadClass {
		return WorkloadClass{GPUs: 1, MemoryPercent: percent, Weight: weight}
	}
	whole := func(n int, weight float64) WorkloadClass {
		return WorkloadClass{GPUs: n, MemoryPercent: MaxPercent, CoresPercent: MaxPercent, Exclusive: true, Weight: weight}
	}
	return NewWorkload(
		whole(1, 0.55), whole(2, 0.002), whole(4, 0.002), whole(8, 0.006),
		share(80, 0.15), share(50, 0.14), share(30, 0.06), share(20, 0.04), share(10, 0.05),
	)
}

// SetSupply tells w how many healthy GPUs of each model the cluster has.
// Each class then weighs its pods per GPU it can use: its weight is
// multiplied by the cluster's GPUs over the GPUs its model filter admits,
// so the free capacity of a model that few GPUs have and many pods are
// pinned to counts for as much as those pods press on it, and pods
// that accept any model are steered away from it. Without a supply (nil
// or empty), every class weighs as if it accepted every GPU. The map is
// copied; call it again when the cluster's GPUs change.
func (w *Workload) SetSupply(gpusByModel map[string]int) {
	w.supply = nil
	if len(gpusByModel) > 0 {
		w.supply = make(map[string]int, len(gpusByModel))
		for m, n := range gpusByModel {
			if n > 0 {
				w.supply[m] = n
			}
		}
	}
	for si := range w.shapes {
		w.scale[si] = w.supplyScale(&w.shapes[si])
	}
	w.fill = nil
	w.refresh()
}

// supplyScale is the scale of shape t (see Workload.scale).
func (w *Workload) supplyScale(t *WorkloadClass) float64 {
	if len(w.supply) == 0 || t.GPUs == 0 || len(t.Models) == 0 && len(t.ExcludeModels) == 0 {
		return 1
	}
	var all, admitted int
	for model, n := range w.supply {
		all += n
		g := GPU{Model: model}
		if modelOK, _ := (Constraints{Models: t.Models, ExcludeModels: t.ExcludeModels}).admits(&g); modelOK {
			admitted += n
		}
	}
	if admitted == 0 {
		return 0
	}
	return float64(all) / float64(admitted)
}

// SetHalfLife makes Add forget: a pod's weight halves after every pods
// more pods are added, so that the workload follows a cluster whose mix
// changes. 0 (the default) never forgets. Weights already in w keep their
// value; only pods added afterwards decay.
func (w *Workload) SetHalfLife(pods float64) {
	w.halfLife = max(pods, 0)
}

// SetHostFitOnly gives, when only is true, the paper's host rule: a class
// can use all of a node's GPUs or none, by whether the host has room for
// one of its pods, however few of them its CPU feeds (see Fragmentation).
// It is for side-by-side runs against the paper's algorithm; false, the
// default, bounds what a class can use by the GPUs the host feeds.
func (w *Workload) SetHostFitOnly(only bool) {
	w.hostFitOnly = only
}

// Classes returns a copy of w's classes, in the order first added.
func (w *Workload) Classes() []WorkloadClass {
	if w == nil {
		return nil
	}
	return slices.Clone(w.classes)
}

// CPUPerGPU is the CPU, in thousandths of a core, that w's pods with GPUs
// request per GPU of demand: their CPU over their GPU demand, each class
// counted as often as its weight. A container's GPU demand is its GPUs
// times the share of each GPU: 1 for whole GPUs, else the larger of
// MemoryPercent and CoresPercent over 100, and 0.1 for a request in MiB
// without cores (its share of a GPU is unknown until it is placed). 0
// when w has no such pods or they request no CPU.
func (w *Workload) CPUPerGPU() float64 {
	if w == nil || w.gpuDemand <= 0 {
		return 0
	}
	return w.gpuCPU / w.gpuDemand
}

// memoryPerGPU is CPUPerGPU for host memory, in MiB.
func (w *Workload) memoryPerGPU() float64 {
	if w.gpuDemand <= 0 {
		return 0
	}
	return w.gpuMemory / w.gpuDemand
}

// Len returns how many classes w has.
func (w *Workload) Len() int {
	if w == nil {
		return 0
	}
	return len(w.classes)
}

// Snapshot returns an independent copy of w with at most maxClasses of
// its classes, the heaviest (ties: the first added), in the order first
// added, and w's supply, half life and host rule. Below 1 keeps every class. A
// scheduler that counts pods into w while others read it hands the
// readers snapshots; it can also replace w by one to bound its size, the
// lightest classes being those it saw least, and longest ago.
func (w *Workload) Snapshot(maxClasses int) *Workload {
	out := &Workload{halfLife: w.halfLife, boost: w.boost, hostFitOnly: w.hostFitOnly, noFill: w.noFill,
		otherCPU: w.otherCPU, otherMemory: w.otherMemory, building: true}
	keep := make([]int, len(w.classes))
	for i := range keep {
		keep[i] = i
	}
	if maxClasses > 0 && len(keep) > maxClasses {
		slices.SortStableFunc(keep, func(a, b int) int {
			return cmp.Compare(w.classes[b].Weight, w.classes[a].Weight)
		})
		keep = keep[:maxClasses]
		slices.Sort(keep)
	}
	for _, i := range keep {
		c := w.classes[i]
		c.Models, c.ExcludeModels = slices.Clone(c.Models), slices.Clone(c.ExcludeModels)
		out.AddClass(c)
	}
	out.building = false
	out.SetSupply(w.supply)
	return out
}

// Add counts one pod: each of its containers that runs with the app
// containers (sidecars included) adds 1 to the weight of the class of its
// shape, with the pod's model filter and host requests, so that the
// measure is the fragmented capacity that the next pod to arrive meets,
// as in the paper. Regular init containers are not counted: they do not
// stay. A pod without GPU containers adds no class: it uses no GPU
// capacity, and what its CPU takes from the pods that do is counted by
// their host bound (see Fragmentation). It still counts towards the half
// life, which is in pods seen. A pod whose model filter is beyond
// Constraints' limits adds no class either (AddClass).
func (w *Workload) Add(pod PodDemand) {
	if w.halfLife > 0 {
		w.age()
	}
	c := pod.Constraints
	if !hasGPUs(pod.Request) {
		w.otherCPU += w.boosted(float64(pod.Host.CPUMilli))
		w.otherMemory += w.boosted(float64(pod.Host.MemoryMiB))
	}
	for _, cr := range pod.Request.Containers {
		if cr.Init && !cr.Sidecar {
			continue
		}
		w.AddClass(WorkloadClass{
			GPUs: cr.GPUs, MemoryMiB: cr.MemoryMiB, MemoryPercent: cr.MemoryPercent,
			CoresPercent: cr.CoresPercent, Exclusive: cr.Exclusive,
			Models: c.Models, ExcludeModels: c.ExcludeModels, Host: pod.Host,
			Weight: w.boosted(1),
		})
	}
}

// age grows the boost of new weights by one pod's worth of decay, and
// scales every weight down when the boost grows large, which leaves the
// shares unchanged.
func (w *Workload) age() {
	if w.boost == 0 {
		w.boost = 1
	}
	w.boost *= math.Exp2(1 / w.halfLife)
	if w.boost < 1e100 {
		return
	}
	f := 1 / w.boost
	w.boost = 1
	for i := range w.classes {
		w.classes[i].Weight *= f
	}
	w.total *= f
	w.gpuDemand *= f
	w.gpuCPU *= f
	w.gpuMemory *= f
	w.otherCPU *= f
	w.otherMemory *= f
	w.refresh()
}

// boosted is weight times the boost of new weights.
func (w *Workload) boosted(weight float64) float64 {
	if w.boost == 0 {
		return weight
	}
	return weight * w.boost
}

// demandGPUs is the GPU capacity a container asks for, in GPUs (see
// CPUPerGPU).
func demandGPUs(gpus int, exclusive bool, memoryPercent, coresPercent int) float64 {
	if exclusive {
		return float64(gpus)
	}
	share := float64(max(memoryPercent, coresPercent)) / MaxPercent
	if share == 0 {
		share = 0.1
	}
	return float64(gpus) * share
}

// AddClass adds c to w, merging it with an equal class (see NewWorkload).
// A class whose Models or ExcludeModels hold more than MaxListItems items,
// or an item longer than MaxListItemLength, is dropped: Fit and
// Fragmentation test every class's filter on every GPU they measure, so a
// workload that learnt one from a pod the webhook never saw would make
// every later placement slow, for as long as the class lasts.
func (w *Workload) AddClass(c WorkloadClass) {
	if c.GPUs < 0 || !(c.Weight > 0) || !boundedFilter(c.Models) || !boundedFilter(c.ExcludeModels) {
		return
	}
	w.adds++
	w.total += c.Weight
	if c.GPUs > 0 {
		w.gpuDemand += c.Weight * demandGPUs(c.GPUs, c.Exclusive, c.MemoryPercent, c.CoresPercent)
		w.gpuCPU += c.Weight * float64(c.Host.CPUMilli)
		w.gpuMemory += c.Weight * float64(c.Host.MemoryMiB)
	}
	defer w.refresh()
	for i := range w.classes {
		if sameShape(w.classes[i], c) && w.classes[i].Host == c.Host {
			w.classes[i].Weight += c.Weight
			return
		}
	}
	shape := slices.IndexFunc(w.shapes, func(s WorkloadClass) bool { return sameShape(s, c) })
	if shape < 0 {
		s := c
		s.Host, s.Weight = HostResources{}, 0
		shape = len(w.shapes)
		w.shapes = append(w.shapes, s)
		w.scale = append(w.scale, w.supplyScale(&s))
	}
	w.classes = append(w.classes, c)
	w.shapeOf = append(w.shapeOf, shape)
}

// boundedFilter reports whether models is within the limits of a
// Constraints list: at most MaxListItems items of at most MaxListItemLength
// bytes.
func boundedFilter(models []string) bool {
	return len(models) <= MaxListItems && !slices.ContainsFunc(models, func(m string) bool { return len(m) > MaxListItemLength })
}

func sameShape(a, b WorkloadClass) bool {
	return a.GPUs == b.GPUs && a.MemoryMiB == b.MemoryMiB && a.MemoryPercent == b.MemoryPercent &&
		a.CoresPercent == b.CoresPercent && a.Exclusive == b.Exclusive &&
		slices.Equal(a.Models, b.Models) && slices.Equal(a.ExcludeModels, b.ExcludeModels)
}

// Fragmentation is the expected amount of node's free GPU capacity, in
// GPUs, that a request drawn from w cannot use. A GPU's free capacity is 1
// minus its used share (the larger of its memory and compute shares; 0
// when no slice is free). For a class, the free capacity of a healthy GPU
// is fragmented when the class cannot take a slice of it (model, slices,
// memory or cores), when fewer of the node's GPUs than the class needs
// can, or when the node's HostFree (if known) lacks the class's Host CPU
// or memory; of n GPUs it could use, a host whose CPU and memory feed
// only b < n of them (Workload.gpuBound) leaves 1 − b/n of their free capacity
// fragmented for it. The class's fragments are weighted by its share of
// w. This is the idea of Weng et al., "Beware of Fragmentation" (USENIX
// ATC '23), applied to memory, compute, slices and the host. Pure; w is
// only read; nil or empty w gives 0.
func Fragmentation(node NodeState, w *Workload) float64 {
	if w == nil {
		return 0
	}
	s := newFitState(PodRequest{}, node.Inventory, node.Usage)
	m := newFragModel(w, node.HostFree, HostResources{}, len(node.Inventory.GPUs))
	m.setFill(node.HostFree, s.freeBefore())
	return m.node(s, false)
}

// fragModel evaluates fragmentation on a fitState for one Fit call.
type fragModel struct {
	w *Workload
	// cnt and sum are, per shape, how many GPUs can take its slice and
	// their free capacity; weight is, per shape, the share of w whose
	// classes can use them on the host before (index 0) and after (1) the
	// pod.
	cnt    []int
	sum    []float64
	weight [2]shapeWeights
	// cntBuf and sumBuf hold cnt and sum for workloads of up to 16
	// shapes, when the model is built from a NodeSummary's weights.
	cntBuf [16]int
	sumBuf [16]float64
	// fill is whether the model counts expected fills (fill.go), with
	// lambda the node's λ.
	fill   bool
	lambda float64
}

// shapeWeights is, per shape, the share of a workload that can use a
// node's GPUs of that shape, given its free host resources. A class can
// use as many of them as the host feeds (Workload.gpuBound): all it could
// take a slice of when the bound is at least the node's GPUs (full), else
// the bound's fraction of them (capped, by how many there are).
type shapeWeights struct {
	// full is, per shape, the share of the classes the host does not
	// bound.
	full []float64
	// capped[si*stride+cnt] is the share that the classes of shape si the
	// host bounds can use of cnt such GPUs; nil when the host bounds none.
	capped []float64
	stride int
}

// at is the share of the workload that can use cnt GPUs of shape si: 0
// when that is fewer than the shape needs.
func (sw *shapeWeights) at(t *WorkloadClass, si, cnt int) float64 {
	if cnt < t.GPUs {
		return 0
	}
	if sw.capped == nil {
		return sw.full[si]
	}
	return sw.full[si] + sw.capped[si*sw.stride+cnt]
}

// fragStats is what stats found besides cnt and sum: the node's free
// capacity in GPUs.
type fragStats struct {
	free float64
}

func newFragModel(w *Workload, hostFree *HostResources, pod HostResources, gpus int) *fragModel {
	n := len(w.shapes)
	buf := make([]float64, 3*n)
	m := &fragModel{w: w, cnt: make([]int, n), sum: buf[:n]}
	m.weight[0].full, m.weight[1].full = buf[n:2*n], buf[2*n:]
	w.fillWeights(hostFree, pod, gpus, &m.weight[0], &m.weight[1])
	return m
}

// fillWeights adds to before and after, per shape, the share of w whose
// classes can use the GPUs of a node of gpus GPUs with hostFree before and
// after the pod's host requests (every class, unbounded, when hostFree is
// nil): fragModel.weight. Their full slices must have a place per shape;
// capped is made when needed. A nil before is skipped.
func (w *Workload) fillWeights(hostFree *HostResources, pod HostResources, gpus int, before, after *shapeWeights) {
	total := w.rich.total
	if w.total <= 0 || total <= 0 {
		return
	}
	// What the host holds before and after the pod, and the GPUs of
	// demand that feeds at the workload's averages: the same for every
	// class. A host that bounds no class gives every class its share.
	var room HostResources
	var feedsBefore, feedsAfter float64
	richBefore, richAfter := true, true
	if hostFree != nil {
		room = HostResources{CPUMilli: hostFree.CPUMilli - pod.CPUMilli, MemoryMiB: hostFree.MemoryMiB - pod.MemoryMiB}
		feedsBefore, feedsAfter = w.hostFeeds(*hostFree), w.hostFeeds(room)
		richBefore, richAfter = w.feedsAll(*hostFree, feedsBefore, gpus), w.feedsAll(room, feedsAfter, gpus)
	}
	if before != nil && richBefore {
		addShares(before.full, w.rich.full)
	}
	if richAfter {
		addShares(after.full, w.rich.full)
	}
	if (before == nil || richBefore) && richAfter {
		return
	}
	for ci := range w.classes {
		c := &w.classes[ci]
		si := w.shapeOf[ci]
		share := c.Weight * w.scale[si] / total
		if before != nil && !richBefore {
			before.add(c, si, share, w.gpuBound(c, *hostFree, feedsBefore), gpus, len(w.shapes))
		}
		if !richAfter {
			after.add(c, si, share, w.gpuBound(c, room, feedsAfter), gpus, len(w.shapes))
		}
	}
}

// addShares adds each shape's share in from to to.
func addShares(to, from []float64) {
	for si, v := range from {
		to[si] += v
	}
}

// hostFeeds is how many GPUs of demand a host with free feeds at w's CPU
// and memory per GPU of demand (CPUPerGPU, memoryPerGPU): the scarcer of
// the two; +Inf when w's pods request neither.
func (w *Workload) hostFeeds(free HostResources) float64 {
	feeds := math.Inf(1)
	if cpg := w.CPUPerGPU(); cpg > 0 {
		feeds = float64(free.CPUMilli) / cpg
	}
	if mpg := w.memoryPerGPU(); mpg > 0 {
		feeds = min(feeds, float64(free.MemoryMiB)/mpg)
	}
	return feeds
}

// gpuBound is how many of a node's GPUs class c can use when its host
// has free, and feeds is hostFeeds(free): none when one of its pods does
// not fit, else as many as free's CPU and memory feed, counting each pod
// at its own requests or at the workload's averages, whichever lets more
// in (+Inf when neither bounds it, for pods without GPUs, and under
// SetHostFitOnly). Its own requests alone would send pods
// that ask for a little more CPU than most to the few nodes richest in
// CPU, which the largest pods need; the workload's alone would bound light
// pods by CPU they do not ask for. Either way a host feeds no more GPUs
// than the scarcer of its CPU and memory holds.
func (w *Workload) gpuBound(c *WorkloadClass, free HostResources, feeds float64) float64 {
	pods := podsRoom(c.Host, free)
	if pods <= 0 {
		return 0
	}
	if c.GPUs == 0 || pods == math.MaxInt64 || w.hostFitOnly {
		return math.Inf(1)
	}
	bound := float64(pods) * float64(c.GPUs)
	if !math.IsInf(feeds, 1) {
		bound = max(bound, feeds/demandGPUs(c.GPUs, c.Exclusive, c.MemoryPercent, c.CoresPercent)*float64(c.GPUs))
	}
	return bound
}

// add counts class c of shape si, with share, on a node of gpus GPUs
// whose host leaves it bound GPUs to use (see shapeWeights).
func (sw *shapeWeights) add(c *WorkloadClass, si int, share, bound float64, gpus, shapes int) {
	switch {
	case bound <= 0:
		return
	case c.GPUs == 0 || bound >= float64(gpus):
		sw.full[si] += share
		return
	}
	if sw.capped == nil {
		sw.stride = gpus + 1
		sw.capped = make([]float64, shapes*sw.stride)
	}
	row := sw.capped[si*sw.stride : (si+1)*sw.stride]
	for cnt := c.GPUs; cnt <= gpus; cnt++ {
		row[cnt] += share * min(1, bound/float64(cnt))
	}
}

// podsRoom is how many pods requesting host fit in free: 0 when none
// does, math.MaxInt64 when host requests neither CPU nor memory.
func podsRoom(host, free HostResources) int64 {
	if host.CPUMilli > free.CPUMilli || host.MemoryMiB > free.MemoryMiB {
		return 0
	}
	pods := int64(math.MaxInt64)
	if host.CPUMilli > 0 {
		pods = free.CPUMilli / host.CPUMilli
	}
	if host.MemoryMiB > 0 {
		pods = min(pods, free.MemoryMiB/host.MemoryMiB)
	}
	return pods
}

// usable reports whether shape t could take a slice of g holding u.
func usable(t *WorkloadClass, g *GPU, u GPUUsage, split int) bool {
	if t.GPUs == 0 {
		return true
	}
	if len(t.Models) > 0 {
		ok := false
		for _, m := range t.Models {
			if containsFold(g.Model, m) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for _, m := range t.ExcludeModels {
		if containsFold(g.Model, m) {
			return false
		}
	}
	return shapeFits(t, g.SchedulableMemoryMiB, g.CoresPercent, u, split)
}

// shapeFits is usable but for the model filter: whether shape t (with
// GPUs) could take a slice of a GPU offering schedulableMiB and coresCap
// and holding u.
func shapeFits(t *WorkloadClass, schedulableMiB int64, coresCap int, u GPUUsage, split int) bool {
	if t.Exclusive {
		return u == (GPUUsage{}) && schedulableMiB > 0 && coresCap >= t.CoresPercent
	}
	need := t.MemoryMiB
	if need == 0 {
		need = schedulableMiB * int64(t.MemoryPercent) / MaxPercent
	}
	return u.Exclusive == 0 && u.Slices < split && need > 0 &&
		u.MemoryMiB+need <= schedulableMiB && u.CoresPercent+t.CoresPercent <= coresCap
}

// stats fills m.cnt and m.sum for the node as s holds it now. GPUs the
// pod holds nothing on are read from the summary when it measured them
// for this workload; the sums are taken in GPU order either way, so the
// result is the same to the bit.
func (m *fragModel) stats(s *fitState) fragStats {
	var fs fragStats
	clear(m.cnt)
	clear(m.sum)
	var cached *fragSummary
	if s.fragCached() {
		cached = s.env.summary.frag
	}
	for gi := range s.node.GPUs {
		g := &s.node.GPUs[gi]
		if g.Health != Healthy {
			continue
		}
		var u GPUUsage
		var free float64
		var mask uint64
		hasMask := false
		if cached != nil && (s.baseOnly || s.untouched(gi)) {
			u, free = s.base[gi], cached.free[gi]
			if cached.masks != nil {
				mask, hasMask = cached.masks[gi], true
			}
		} else {
			u = s.total(gi)
			free = 1 - usedShare(g, u, s.node.SplitCount)
		}
		fs.free += free
		if free <= 0 {
			continue
		}
		canUse := func(si int) bool {
			return hasMask && mask&(1<<si) != 0 || !hasMask && usable(&m.w.shapes[si], g, u, s.node.SplitCount)
		}
		value := m.value(g, u, free, canUse)
		for si := range m.w.shapes {
			if canUse(si) {
				m.cnt[si]++
				m.sum[si] += value
			}
		}
	}
	return fs
}

// node returns the fragmentation of the node as s holds it now, with the
// pod's host requests counted when after.
func (m *fragModel) node(s *fitState, after bool) float64 {
	if m.w.total <= 0 {
		return 0
	}
	fs := m.stats(s)
	weight := &m.weight[0]
	if after {
		weight = &m.weight[1]
	}
	return m.measure(fs.free, weight)
}

// measure is the fragmentation of a node whose free capacity is free and
// whose stats are m.cnt and m.sum, weighed by weight. It only reads m.
func (m *fragModel) measure(free float64, weight *shapeWeights) float64 {
	// Every class sees all free capacity, less what it can use; classes
	// that do not fit the host (absent from weight) can use none.
	var usableFree float64
	for si := range m.w.shapes {
		if m.cnt[si] >= m.w.shapes[si].GPUs {
			usableFree += weight.at(&m.w.shapes[si], si, m.cnt[si]) * m.sum[si]
		}
	}
	return free - usableFree
}

// afterOne is the fragmentation after the pod when it changes GPU gi alone,
// from before to after: the node without the pod, weighed by what the host
// leaves the classes after the pod, plus delta. m.cnt and m.sum are the
// node's stats without the pod and free its free capacity. Fit and
// NodeSummary.Fit both measure such pods this way, so they agree to the
// bit, and neither walks the node's GPUs again.
func (m *fragModel) afterOne(s *fitState, free float64, gi int, before, after GPUUsage) float64 {
	if m.w.total <= 0 {
		return 0
	}
	return m.measure(free, &m.weight[1]) + m.delta(s, gi, before, after)
}

// delta returns the change in fragmentation when GPU gi goes from holding
// before to holding after, the rest of the node as in fs (from stats) and
// the pod's host requests counted.
func (m *fragModel) delta(s *fitState, gi int, before, after GPUUsage) float64 {
	if m.w.total <= 0 {
		return 0
	}
	g := &s.node.GPUs[gi]
	split := s.node.SplitCount
	free0 := 1 - usedShare(g, before, split)
	free1 := 1 - usedShare(g, after, split)
	weight := &m.weight[1]
	value0 := m.value(g, before, free0, func(si int) bool { return free0 > 0 && usable(&m.w.shapes[si], g, before, split) })
	value1 := m.value(g, after, free1, func(si int) bool { return free1 > 0 && usable(&m.w.shapes[si], g, after, split) })
	var d float64
	for si := range m.w.shapes {
		t := &m.w.shapes[si]
		left := free0 > 0 && usable(t, g, before, split)
		joins := free1 > 0 && usable(t, g, after, split)
		d -= weight.usableChange(t, si, m.cnt[si], m.sum[si], value0, left, value1, joins)
	}
	// Every class sees the change of free capacity; those that can use it
	// got it back above.
	return d + (free1 - free0)
}

// usableChange is how much the weighed free capacity shape si can use
// changes when one GPU leaves its cnt usable GPUs of free capacity sum
// (left: with free0 of it) and joins them again (joins: with free1): what
// fragModel.delta and NodeSummary.cellDelta subtract per shape. 0 when the
// GPU neither left nor joined.
func (sw *shapeWeights) usableChange(t *WorkloadClass, si, cnt int, sum, free0 float64, left bool, free1 float64, joins bool) float64 {
	cnt0 := cnt
	var old float64
	if cnt >= t.GPUs {
		old = sum
	}
	if left {
		cnt--
		sum -= free0
	}
	if joins {
		cnt++
		sum += free1
	}
	var now float64
	if cnt >= t.GPUs {
		now = sum
	}
	if sw.capped == nil {
		return sw.full[si] * (now - old)
	}
	return sw.at(t, si, cnt)*now - sw.at(t, si, cnt0)*old
}

package vgpu

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
)

// A fragment's expected fill. The fragmentation measure asks whether the
// next pod can use a GPU's free capacity; a GPU partly used is filled,
// though, by the pods that come after, and a free share that the workload's
// slices fill well (0.53 beside a slice of 0.47 when slices of 0.47 are
// common) is worth more than one they leave gaps in (0.21 beside 0.47 and
// 0.32, which only the rare slices of 0.21 or less fit). A Workload with a
// supply learns, per GPU model, fillTable: the expected share a GPU with a
// free share r ends with unused when the workload's one-GPU slices are
// packed best fit, and a class counts of a partly used GPU its expected use
// (free share less that waste) instead of all of its free share. Only the
// GPUs a node's host can feed count it so: a node whose free CPU and
// memory, at the workload's requests per GPU of demand (pods without GPUs
// included, as they take the same hosts), feed a fraction λ < 1 of its free
// capacity counts λ of the expected use and 1 − λ of the free share, as
// before.

// Constants of the fill estimate: how many slices one replay of the
// workload packs, how many replays are averaged, and after how many counted
// pods the tables are learnt again. They set the estimate's horizon and
// noise, not what any trace packs into.
const (
	fillItems   = 1000
	fillRuns    = 8
	fillRefresh = 100
)

// SetExpectedFill turns the counting of expected fills on (the default
// for a Workload with a supply) or off (the paper's measure of what the
// next pod can use, weighed by the supply).
func (w *Workload) SetExpectedFill(on bool) {
	w.noFill = !on
	w.fill = nil
	w.refreshFill()
}

// refreshFill relearns w's fill tables when they are missing, or when
// fillRefresh classes were added since they were learnt (a tenth of those
// added, while fewer than ten times fillRefresh were, as the extender
// renews its snapshots). Without a supply w has none.
func (w *Workload) refreshFill() {
	if len(w.supply) == 0 || w.noFill {
		w.fill = nil
		return
	}
	if w.building || w.fill != nil && w.adds-w.fillAt < min(fillRefresh, max(1, w.adds/10)) {
		return
	}
	fill := make(map[string][]float64, len(w.supply)+1)
	if t := w.fillTable(""); t != nil {
		fill[""] = t
	}
	for m := range w.supply {
		if t := w.fillTable(m); t != nil {
			fill[m] = t
		}
	}
	if len(fill) == 0 {
		// No slice given as a share of a GPU: nothing to learn a fill from.
		fill = nil
	}
	w.fill, w.fillAt = fill, w.adds
}

// fillShare is the share, in thousandths, of one GPU that shape t takes, for
// one-GPU slices given in percent; ok is false for other shapes.
func fillShare(t *WorkloadClass) (milli int, ok bool) {
	if t.GPUs != 1 || t.Exclusive || t.MemoryMiB > 0 {
		return 0, false
	}
	milli = 10 * max(t.MemoryPercent, t.CoresPercent)
	return milli, milli > 0 && milli < 1000
}

// fillTable learns, for GPUs of model ("" for any), the expected share a
// GPU with r thousandths free ends with unused (index r): fillRuns replays
// of fillItems slices drawn from the shapes the model admits, by their
// weight, each placed on the GPU that leaves the least free share, or a new
// one. A share no replay saw counts as never filled. Only slices given as a
// share of a GPU (percent) are drawn; without any the model has no table
// (nil), and its GPUs count their free share as the paper's measure does.
func (w *Workload) fillTable(model string) []float64 {
	type draw struct {
		milli int
		upTo  float64
	}
	var draws []draw
	var total, demand float64
	g := GPU{Model: model}
	for si := range w.shapes {
		t := &w.shapes[si]
		if model != "" && !modelAdmits(t, &g) {
			continue
		}
		demand += w.rich.full[si] * demandGPUs(t.GPUs, t.Exclusive, t.MemoryPercent, t.CoresPercent)
		if milli, ok := fillShare(t); ok && w.rich.full[si] > 0 {
			total += w.rich.full[si]
			draws = append(draws, draw{milli, total})
		}
	}
	if len(draws) == 0 || demand <= 0 {
		return nil
	}
	// The horizon: fillItems slices, or fewer when the GPUs (of the
	// model) fill with fewer, at the workload's mix.
	gpus := 0
	for m, n := range w.supply {
		if model == "" || m == model {
			gpus += n
		}
	}
	items := min(fillItems, int(math.Ceil(float64(gpus)*total/demand)))
	runs := fillRuns * fillItems / max(items, 1)
	var sum [1001]float64
	var seen [1001]int
	rng := rand.New(rand.NewPCG(1, 2)) //nolint:gosec // G404: a reproducible replay of the workload, not a secret
	var byGap [1001][]int
	var gap []int
	var hist [][]int
	for range runs {
		for r := range byGap {
			byGap[r] = byGap[r][:0]
		}
		gap, hist = gap[:0], hist[:0]
		for range items {
			x := rng.Float64() * total
			k, _ := slices.BinarySearchFunc(draws, x, func(d draw, x float64) int {
				if d.upTo <= x {
					return -1
				}
				return 1
			})
			a := draws[min(k, len(draws)-1)].milli
			r := a
			for r < 1000 && len(byGap[r]) == 0 {
				r++
			}
			if r == 1000 {
				byGap[1000-a] = append(byGap[1000-a], len(gap))
				gap = append(gap, 1000-a)
				hist = append(hist, []int{1000 - a})
				continue
			}
			l := byGap[r]
			i := l[len(l)-1]
			byGap[r] = l[:len(l)-1]
			gap[i] = r - a
			hist[i] = append(hist[i], r-a)
			byGap[r-a] = append(byGap[r-a], i)
		}
		for i, h := range hist {
			for j, r := range h {
				if !slices.Contains(h[:j], r) {
					sum[r] += float64(gap[i]) / 1000
					seen[r]++
				}
			}
		}
	}
	waste := make([]float64, 1001)
	for r := range waste {
		waste[r] = float64(r) / 1000 // never filled, unless a replay saw it
		if r > 0 && r < 1000 && seen[r] > 0 {
			waste[r] = sum[r] / float64(seen[r])
		}
	}
	return waste
}

// modelAdmits is usable's model filter alone: whether t's model filter
// admits g.
func modelAdmits(t *WorkloadClass, g *GPU) bool {
	if t.GPUs == 0 {
		return true
	}
	if len(t.Models) > 0 && !slices.ContainsFunc(t.Models, func(m string) bool { return containsFold(g.Model, m) }) {
		return false
	}
	return !slices.ContainsFunc(t.ExcludeModels, func(m string) bool { return containsFold(g.Model, m) })
}

// hostFeedsAll is hostFeeds at the CPU and memory per GPU of demand of all
// of w's pods, those without GPUs included.
func (w *Workload) hostFeedsAll(free HostResources) float64 {
	if w.gpuDemand <= 0 {
		return math.Inf(1)
	}
	feeds := math.Inf(1)
	if cpg := (w.gpuCPU + w.otherCPU) / w.gpuDemand; cpg > 0 {
		feeds = float64(free.CPUMilli) / cpg
	}
	if mpg := (w.gpuMemory + w.otherMemory) / w.gpuDemand; mpg > 0 {
		feeds = min(feeds, float64(free.MemoryMiB)/mpg)
	}
	return feeds
}

// fillLambda is λ (above) for a node with hostFree (nil: unknown, 1) and
// freeCap GPUs of free capacity.
func (w *Workload) fillLambda(hostFree *HostResources, freeCap float64) float64 {
	if hostFree == nil || freeCap <= 0 {
		return 1
	}
	return min(1, max(0, w.hostFeedsAll(*hostFree)/freeCap))
}

// setFill makes m count expected fills on a node with hostFree and
// freeCap GPUs of free capacity before the pod, when its workload has fill
// tables.
func (m *fragModel) setFill(hostFree *HostResources, freeCap float64) {
	m.fill = m.w.fill != nil
	if m.fill {
		m.lambda = m.w.fillLambda(hostFree, freeCap)
	}
}

// value is what each shape that can use GPU g, holding u with free share
// free, counts of it: free when m counts no fills or g is untouched; else
// valueAt with g's fill table and the weight of the shapes that can use g
// (usable: whether shape si can).
func (m *fragModel) value(g *GPU, u GPUUsage, free float64, usable func(si int) bool) float64 {
	if !m.fill || free <= 0 || u == (GPUUsage{}) {
		return free
	}
	var p float64
	for si := range m.w.shapes {
		if usable(si) {
			p += m.w.rich.full[si]
		}
	}
	return m.valueAt(m.w.fillFor(g), m.w.admittedFull(g), free, p)
}

// valueAt is value for a partly used GPU with free share free, whose
// model has fill table table and admits shapes of weight q, and that
// shapes of weight p (summed in shape order) can use: the expected use of
// the free share, spread over those shapes and weighed by the share of the
// workload that its model admits, λ of it, and 1 − λ of free.
func (m *fragModel) valueAt(table []float64, q, free, p float64) float64 {
	if p <= 0 || table == nil {
		return free
	}
	r := min(max(int(math.Round(free*1000)), 0), 1000)
	return m.lambda*(free-table[r])*q/p + (1-m.lambda)*free
}

// fillFor is the fill table of g's model, else the one for any model, or
// nil.
func (w *Workload) fillFor(g *GPU) []float64 {
	if t := w.fill[g.Model]; t != nil {
		return t
	}
	return w.fill[""]
}

// fullOf is the weight of the shapes in mask, summed in shape order.
func (w *Workload) fullOf(mask uint64) float64 {
	var p float64
	for ; mask != 0; mask &= mask - 1 {
		p += w.rich.full[bits.TrailingZeros64(mask)]
	}
	return p
}

// admittedFull is the weight of the shapes whose model filter admits g,
// summed in shape order: w.rich's for the models of the supply.
func (w *Workload) admittedFull(g *GPU) float64 {
	if q, ok := w.rich.admitted[g.Model]; ok {
		return q
	}
	return admittedOf(w.shapes, w.rich.full, g)
}

// admittedOf is admittedFull over shapes weighing full.
func admittedOf(shapes []WorkloadClass, full []float64, g *GPU) float64 {
	var q float64
	for si := range shapes {
		if modelAdmits(&shapes[si], g) {
			q += full[si]
		}
	}
	return q
}

// hasGPUs reports whether r has a container that runs with the app
// containers and asks for GPUs.
func hasGPUs(r PodRequest) bool {
	for _, cr := range r.Containers {
		if cr.GPUs > 0 && (!cr.Init || cr.Sidecar) {
			return true
		}
	}
	return false
}

// freeBefore is the node's free GPU capacity without the pod: its healthy
// GPUs' free shares summed in GPU order (Fit's and Summarize's λ).
func (s *fitState) freeBefore() float64 {
	var free float64
	for gi := range s.node.GPUs {
		if g := &s.node.GPUs[gi]; g.Health == Healthy {
			free += 1 - usedShare(g, s.base[gi], s.node.SplitCount)
		}
	}
	return free
}

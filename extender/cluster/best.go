package cluster

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpuslice/gpuslice/vgpu"
)

// unjudged is the value of a node that JudgeBest left unfitted because
// its bound is below the best score: below every score, so Filter leaves
// it out of its answer.
const unjudged = -1

// JudgeBest sets verdicts[i] to the verdict of names[i] for d, a pod
// that asks for GPUs, as JudgeAll would, but for a Filter that passes
// only the nodes of the best score: it fits a node that its screen
// (readiness, the summary's Reject, a remembered verdict) leaves undecided
// only while the node's vgpu.NodeFigures.ScoreBound, and then its
// summary's ScoreBoundByGPU, can reach the best score found so far
// (vgpu.NodeScore.CannotReach: under fragmentation many nodes tie at one
// Value, and many at one Raw, so Raw and Tie are bounded too). A node it
// does not fit gets a fitting verdict of value unjudged: it could not have
// tied the best score, and Filter leaves it out without saying whether
// the pod fits there. When no node fits, every node is fitted, so the
// pod's FailedScheduling event still names each node's reason.
//
// A best score comes early from a sample: about sampleNodes nodes, evenly
// spaced, are screened first and fitted in order of their bounds, highest
// first. Then one pass over the rest, in the order of names (mostly the
// order their states lie in memory), screens each node and fits it or
// not. Under binpack and spread most nodes of a new pod shape are then
// never fitted.
func (st *State) JudgeBest(names []string, d *Demand, verdicts []Verdict) {
	st.lockJudging(d)
	defer st.unlockJudging(d)
	now := st.now()
	buf := boundPool.Get().(*boundBuffers)
	defer boundPool.Put(buf)
	done := buf.size(len(names))
	opts := st.fitOptionsLocked(d)
	var best atomic.Pointer[vgpu.NodeScore] // nil until a node fits
	raise := func(v Verdict) {
		for v.Fits {
			b := best.Load()
			if b != nil && v.Score.Compare(*b) <= 0 {
				return
			}
			score := v.Score // only a better score is allocated
			if best.CompareAndSwap(b, &score) {
				return
			}
		}
	}
	// screen decides node i, or returns it undecided with its bound:
	// the one remembered from an earlier pod of the shape (byGPU), else
	// its figures'.
	screen := func(i int) (n *nodeState, bound vgpu.NodeScore, byGPU, undecided bool) {
		n = st.nodes[names[i]]
		if n == nil || !n.known {
			verdicts[i] = st.evaluateLocked(names[i], d, now)
			return nil, vgpu.NodeScore{}, false, false
		}
		v, decided := st.screenLocked(n, d, now)
		switch {
		case decided:
			v.Node = n.index
			verdicts[i] = v
			raise(v)
			return nil, vgpu.NodeScore{}, false, false
		case v.Bounded:
			return n, v.Score, true, true
		}
		return n, n.figures.ScoreBound(d.Pod, opts), false, true
	}
	// below reports whether no placement under bound can tie the best
	// score found.
	below := func(bound vgpu.NodeScore) bool {
		b := best.Load()
		return b != nil && bound.CannotReach(*b)
	}
	fit := func(i int, n *nodeState, bound vgpu.NodeScore, byGPU bool) {
		// The node's figures first, then its GPUs' (which the fit
		// would read anyway). A bound by GPU that leaves the node out is
		// remembered for the pods of the shape that follow while the
		// node does not change; one that does not is replaced by the
		// fit's verdict.
		out := below(bound)
		if !out && !byGPU {
			bound = n.summary.ScoreBoundByGPU(d.Pod, opts, bound)
			if out = below(bound); out && n.summaryWorkload == st.workload {
				n.verdicts.put(d.Key, n.gen, Verdict{Bounded: true, Score: bound})
			}
		}
		if out {
			verdicts[i] = Verdict{Fits: true, Score: vgpu.NodeScore{Value: unjudged}, Node: n.index}
			return
		}
		v := st.fitLocked(n, d)
		v.Node = n.index
		verdicts[i] = v
		raise(v)
	}
	stride := max(1, len(names)/sampleNodes)
	leads := buf.leads[:0]
	for i := 0; i < len(names); i += stride {
		done[i] = true
		if n, bound, byGPU, ok := screen(i); ok {
			leads = append(leads, lead{i, n, bound, byGPU})
		}
	}
	slices.SortFunc(leads, func(a, b lead) int { return b.bound.Compare(a.bound) })
	for _, l := range leads {
		fit(l.i, l.n, l.bound, l.byGPU)
	}
	buf.leads = leads
	defer clear(leads) // the pool keeps no node alive
	forEach(len(names), func(i int) {
		if done[i] {
			return
		}
		if n, bound, byGPU, ok := screen(i); ok {
			fit(i, n, bound, byGPU)
		}
	})
}

// sampleNodes is about how many nodes JudgeBest screens first, evenly
// spaced among the candidates, and fits in order of their bounds, highest
// first, for a best score to bound the others by.
const sampleNodes = 64

// lead is a node of JudgeBest's sample left undecided by the screen:
// its position in the candidates, its state and its bound (byGPU: its
// summary's ScoreBoundByGPU).
type lead struct {
	i     int
	n     *nodeState
	bound vgpu.NodeScore
	byGPU bool
}

// boundBuffers are JudgeBest's per-node slices, kept between calls.
type boundBuffers struct {
	done  []bool
	leads []lead
}

var boundPool = sync.Pool{New: func() any { return new(boundBuffers) }}

// size returns done for count nodes, all false.
func (b *boundBuffers) size(count int) []bool {
	if cap(b.done) < count {
		b.done = make([]bool, count)
	}
	done := b.done[:count]
	clear(done)
	return done
}

package extender

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpuslice/gpuslice/vgpu"
)

// unjudged is the value of a node that evaluateBest left unfitted because
// its bound is below the best score: below every score, so Filter leaves
// it out of its answer.
const unjudged = -1

// evaluateBest sets verdicts[i] to the verdict of names[i] for d, a pod
// that asks for GPUs, as evaluateAll would, but for a Filter that passes
// only the nodes of the best score: it fits a node that its screen
// (readiness, the summary's Reject, a remembered verdict) leaves undecided
// only while the node's vgpu.NodeFigures.ScoreBound can reach the best
// score found so far: its Value that score's Value, and its Raw that
// score's Raw (the best Raw is the best score's, as Value never rises when
// Raw falls; many nodes tie at one Value under fragmentation, where
// slices change a node's fragmentation by less than a Value step). A node
// it does not fit gets a fitting verdict of
// value unjudged: it could not have tied the best score, and Filter
// leaves it out without saying whether the pod fits there. When no node
// fits, every node is fitted, so the pod's FailedScheduling event still
// names each node's reason.
//
// A best score comes early from a sample: about sampleNodes nodes, evenly
// spaced, are screened first and fitted in order of their bounds, highest
// first. Then one pass over the rest, in the order of names (mostly the
// order their states lie in memory), screens each node and fits it or
// not. Under binpack and spread most nodes of a new pod shape are then
// never fitted.
func (s *Scheduler) evaluateBest(names []string, d *demand, verdicts []verdict) {
	s.lockJudging(d)
	defer s.unlockJudging(d)
	now := s.clock.Now()
	st := s.state
	buf := boundPool.Get().(*boundBuffers)
	defer boundPool.Put(buf)
	done := buf.size(len(names))
	opts := s.fitOptionsLocked(d)
	best := new(atomic.Int64)
	best.Store(unjudged)
	bestRaw := new(atomic.Uint64) // float64 bits
	bestRaw.Store(math.Float64bits(math.Inf(-1)))
	raise := func(v verdict) {
		for v.fits {
			b := best.Load()
			if int64(v.score.Value) <= b || best.CompareAndSwap(b, int64(v.score.Value)) {
				break
			}
		}
		for v.fits {
			b := bestRaw.Load()
			if v.score.Raw <= math.Float64frombits(b) || bestRaw.CompareAndSwap(b, math.Float64bits(v.score.Raw)) {
				return
			}
		}
	}
	// screen decides node i, or returns it undecided with its bound.
	screen := func(i int) (n *nodeState, bound vgpu.NodeScore, undecided bool) {
		n = st.nodes[names[i]]
		if n == nil || !n.known {
			verdicts[i] = s.evaluateLocked(names[i], d, now)
			return nil, vgpu.NodeScore{}, false
		}
		v, decided := s.screenLocked(n, d, now)
		if decided {
			v.node = n.index
			verdicts[i] = v
			raise(v)
			return nil, vgpu.NodeScore{}, false
		}
		return n, n.figures.ScoreBound(d.pod, opts), true
	}
	fit := func(i int, n *nodeState, bound vgpu.NodeScore) {
		// A Raw below the best's by more than vgpu.NodeScore.Compare's
		// tolerance cannot tie it.
		if int64(bound.Value) < best.Load() || bound.Raw < math.Float64frombits(bestRaw.Load())-rawTolerance {
			verdicts[i] = verdict{fits: true, score: vgpu.NodeScore{Value: unjudged}, node: n.index}
			return
		}
		v := s.fitLocked(n, d)
		v.node = n.index
		verdicts[i] = v
		raise(v)
	}
	stride := max(1, len(names)/sampleNodes)
	leads := buf.leads[:0]
	for i := 0; i < len(names); i += stride {
		done[i] = true
		if n, bound, ok := screen(i); ok {
			leads = append(leads, lead{i, n, bound})
		}
	}
	slices.SortFunc(leads, func(a, b lead) int { return b.bound.Compare(a.bound) })
	for _, l := range leads {
		fit(l.i, l.n, l.bound)
	}
	buf.leads = leads
	defer clear(leads) // the pool keeps no node alive
	forEach(len(names), func(i int) {
		if done[i] {
			return
		}
		if n, bound, ok := screen(i); ok {
			fit(i, n, bound)
		}
	})
}

// sampleNodes is about how many nodes evaluateBest screens first, evenly
// spaced among the candidates, and fits in order of their bounds, highest
// first, for a best score to bound the others by.
const sampleNodes = 64

// rawTolerance is how far below the best Raw a node's bound must be for
// evaluateBest to leave it unfitted: above vgpu.NodeScore.Compare's own
// tolerance for Raws summed in different orders.
const rawTolerance = 1e-9

// lead is a node of evaluateBest's sample left undecided by the screen:
// its position in the candidates, its state and its bound.
type lead struct {
	i     int
	n     *nodeState
	bound vgpu.NodeScore
}

// boundBuffers are evaluateBest's per-node slices, kept between calls.
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

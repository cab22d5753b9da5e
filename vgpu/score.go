package vgpu

import "math"

// MaxScore is the best NodeScore.Value.
const MaxScore = 100

// NodeScore ranks a node for a pod under the node policy: higher is better.
type NodeScore struct {
	// Value is 0 to MaxScore, what a scheduler adds up across plugins.
	Value int
	// Raw is the policy's measure before rounding to Value; higher is
	// better and Value never increases when Raw decreases, so callers that
	// compare nodes of one pod may break Value ties with Raw.
	Raw float64
	// Tie breaks ties of Raw: higher is better. PolicyFragmentation sets
	// it to the share of the node's healthy GPU capacity in use after the
	// pod (0 to 1), so that among nodes whose fragmentation changes alike
	// the fuller one wins, as under binpack; other policies leave it 0.
	Tie float64
}

// Score ranks the node of placement p (from Fit) under p.NodePolicy:
//   - PolicyBinpack prefers fuller nodes: Raw is the share of the node's
//     healthy GPU capacity in use after the pod (0 to 1), Value is 100×Raw.
//   - PolicySpread prefers emptier nodes: Raw is 1 minus that share.
//   - PolicyFragmentation prefers the least increase of fragmentation
//     (FragmentationAfter − FragmentationBefore, in GPUs; negative when the
//     pod fills a fragment): Raw is minus the increase and Value is
//     50 − 25×increase, clamped to 0..100, so a placement that fragments
//     nothing scores 50 and one that wastes 2 GPUs scores 0. Tie is the
//     binpack share, for callers that break ties of Raw.
//
// Under PolicyFragmentation, a pod that asks for no GPU on a node whose
// host CPU is known (p.HasCPUSurplus) goes where CPU is most in surplus:
// Raw is p.CPUSurplusMilli in cores and Value is 50 + Raw, clamped to
// 0..100, so that CPU-only pods take the CPU that no GPU on the node will
// want before that which would strand a free GPU. Otherwise a node with
// no healthy GPU scores 0. Score is pure.
func Score(p Placement) NodeScore {
	r := rulesOf(p.NodePolicy)
	if r.cpuSurplus && p.HasCPUSurplus {
		raw := p.CPUSurplusMilli / 1000
		return NodeScore{Value: int(math.Round(min(max(MaxScore/2+raw, 0), MaxScore))), Raw: raw}
	}
	if p.HealthyGPUs == 0 {
		return NodeScore{}
	}
	used := p.UsedAfter / float64(p.HealthyGPUs)
	raw := r.nodeRaw(used, p.FragmentationAfter-p.FragmentationBefore)
	return NodeScore{Value: int(math.Round(min(max(r.value(raw), 0), MaxScore))), Raw: raw, Tie: r.tie(used)}
}

// scoreEpsilon is how far apart two Raw or Tie values must be to differ: the policies' measures
// are sums of float64 shares, and a placement's score must not depend on the order they were
// added in.
const scoreEpsilon = 1e-12

// Compare orders two scores of one pod on different nodes: Value, then Raw, then Tie, higher
// first. It returns a positive number when s is better than o, a negative one when worse, and 0
// when they tie, which is when a scheduler should let other criteria choose.
func (s NodeScore) Compare(o NodeScore) int {
	switch {
	case s.Value != o.Value:
		return s.Value - o.Value
	case s.Raw > o.Raw+scoreEpsilon:
		return 1
	case s.Raw < o.Raw-scoreEpsilon:
		return -1
	case s.Tie > o.Tie+scoreEpsilon:
		return 1
	case s.Tie < o.Tie-scoreEpsilon:
		return -1
	}
	return 0
}

package vgpu

import (
	"fmt"
	"strings"
)

// Policy says how to choose among places that fit: nodes (node policy) or
// GPUs inside a node (GPU policy). The empty Policy means "not set": the
// next default applies. What each one does is its entry of policyTable.
type Policy string

const (
	// PolicyBinpack prefers the fullest node, or the most-used GPU, that
	// fits, keeping whole GPUs and whole nodes free for large requests.
	PolicyBinpack Policy = "binpack"
	// PolicySpread prefers the emptiest node or least-used GPU, trading
	// packing for less interference between pods.
	PolicySpread Policy = "spread"
	// PolicyFragmentation prefers the placement that increases the node's
	// fragmentation the least, measured against a Workload of typical
	// requests (see Fragmentation).
	PolicyFragmentation Policy = "fragmentation"
)

// Policies lists the policies a pod or configuration may name, in the
// order messages show them. Each call returns a new slice.
func Policies() []Policy {
	out := make([]Policy, 0, len(policyTable))
	for i := range policyTable {
		if policyTable[i].named {
			out = append(out, policyTable[i].policy)
		}
	}
	return out
}

// ParsePolicy reads a policy name: exactly one of Policies, or "" for not
// set. Anything else, PolicyFirstFit included, is an error wrapping
// ErrMalformed that lists the valid names.
func ParsePolicy(s string) (Policy, error) {
	for i := range policyTable {
		if r := &policyTable[i]; r.named && s == string(r.policy) {
			return r.policy, nil
		}
	}
	if s == "" {
		return "", nil
	}
	return "", fmt.Errorf("%w: %q: must be one of %s", ErrMalformed, s, PolicyList())
}

// PolicyList is Policies joined with ", ", for messages.
func PolicyList() string {
	names := make([]string, 0, len(policyTable))
	for _, p := range Policies() {
		names = append(names, string(p))
	}
	return strings.Join(names, ", ")
}

// RanksByCPUSurplus reports whether Score, under node policy p, ranks the
// nodes of a pod that asks for no GPU by their CPU surplus where their free
// host CPU is known (Placement.CPUSurplusMilli; PolicyFragmentation). ""
// and policies Fit does not know answer as PolicyBinpack. Pure.
func (p Policy) RanksByCPUSurplus() bool { return rulesOf(p).cpuSurplus }

// policyRules is what one Policy does, read by every path that applies it:
// as GPU policy by Fit's ranking of a container's GPUs (fitState.rank) and
// by the summary's quick path (NodeSummary.quickFit), as node policy by
// Score, ScoreBound and ScoreBoundByGPU. Each path looks its rules up once
// per call (rulesOf) and calls them for each GPU or node; the funcs take
// and return numbers only, so that calling them allocates nothing. The
// paths must agree to the bit (TestSummaryFitEqualsFit), and they do
// because they share these funcs: a new policy is one entry of policyTable.
type policyRules struct {
	// policy is the Policy the rules are for.
	policy Policy
	// named is true for the policies a pod or configuration can name
	// (Policies, ParsePolicy).
	named bool
	// fragmentation is true when the policy reads the node's
	// fragmentation against the workload (FitOptions.Workload): as GPU
	// policy gpuKey reads each candidate GPU's delta, as node policy
	// nodeRaw reads the pod's rise and rawBound the fall that ScoreBound
	// allows. Fit measures them only then.
	fragmentation bool
	// inOrder is true when, as GPU policy, each container takes the first
	// GPUs that fit in NodeInventory.GPUs order, unranked; gpuKey is then
	// never called.
	inOrder bool
	// gpuKey ranks a GPU that fits a container, lower first: used is the
	// GPU's used share before the container (0 to 1; usedShare), delta how
	// much the node's fragmentation rises with the container's slice
	// there (in GPUs; 0 unless fragmentation). Equal keys go to the fuller
	// GPU, then the lower position.
	gpuKey func(used, delta float64) float64
	// nodeRaw is Score's NodeScore.Raw of a placement, higher better: used
	// is the share of the node's healthy GPU capacity in use after the pod
	// (0 to 1), rise how much the pod raises the node's fragmentation
	// (FragmentationAfter − FragmentationBefore, in GPUs; 0 unless
	// fragmentation).
	nodeRaw func(used, rise float64) float64
	// rawBound is ScoreBound's bound on nodeRaw for a pod of one slice on
	// a node whose used share is before without the pod and at most after
	// with it, and whose fragmentation the slice lowers by at most fall
	// (in GPUs; 0 unless fragmentation).
	rawBound func(before, after, fall float64) float64
	// value is NodeScore.Value of a Raw, before rounding and clamping to
	// 0..MaxScore; it never falls as raw rises.
	value func(raw float64) float64
	// tie is NodeScore.Tie of a placement whose used share after the pod
	// is used (Score), and a bound on it from a bound on used
	// (ScoreBound); it never falls as used rises.
	tie func(used float64) float64
	// cpuSurplus is true when Score ranks a pod that asks for no GPU, on a
	// node whose free host CPU is known, by its CPU surplus
	// (Placement.CPUSurplusMilli) rather than by nodeRaw.
	cpuSurplus bool
}

// policyTable holds the rules of every policy, the named ones in the order
// Policies lists them. Its first entry applies to "" and to any Policy
// not in it (rulesOf), as resolve defaults to PolicyBinpack. Never
// modified.
var policyTable = [...]policyRules{{
	policy: PolicyBinpack, named: true,
	gpuKey: fullerFirst, nodeRaw: usedRaw, rawBound: usedAfterBound, value: scaled, tie: noTie,
}, {
	policy: PolicySpread, named: true,
	gpuKey: emptierFirst, nodeRaw: freeRaw, rawBound: freeBeforeBound, value: scaled, tie: noTie,
}, {
	policy: PolicyFragmentation, named: true, fragmentation: true, cpuSurplus: true,
	gpuKey: leastRise, nodeRaw: fallRaw, rawBound: fallBound, value: centred, tie: usedTie,
}, {
	// As node policy, binpack's: callers pass it as GPU policy only.
	policy: PolicyFirstFit, inOrder: true,
	gpuKey: fullerFirst, nodeRaw: usedRaw, rawBound: usedAfterBound, value: scaled, tie: noTie,
}}

// rulesOf returns the rules of p; "" and policies not in policyTable get
// its first entry's. Safe for concurrent use.
func rulesOf(p Policy) *policyRules {
	for i := range policyTable {
		if policyTable[i].policy == p {
			return &policyTable[i]
		}
	}
	return &policyTable[0]
}

// fullerFirst is binpack's gpuKey: the most used GPU first.
func fullerFirst(used, _ float64) float64 { return -used }

// emptierFirst is spread's gpuKey: the least used GPU first.
func emptierFirst(used, _ float64) float64 { return used }

// leastRise is fragmentation's gpuKey: the GPU whose slice raises the
// node's fragmentation least first.
func leastRise(_, delta float64) float64 { return delta }

// usedRaw is binpack's nodeRaw: the node's used share after the pod.
func usedRaw(used, _ float64) float64 { return used }

// freeRaw is spread's nodeRaw: the node's free share after the pod.
func freeRaw(used, _ float64) float64 { return 1 - used }

// fallRaw is fragmentation's nodeRaw: how far the pod lowers the node's
// fragmentation (negative when it raises it).
func fallRaw(_, rise float64) float64 { return -rise }

// usedAfterBound is binpack's rawBound: usedRaw rises with the share.
func usedAfterBound(_, after, _ float64) float64 { return after }

// freeBeforeBound is spread's rawBound: the share only rises.
func freeBeforeBound(before, _, _ float64) float64 { return 1 - before }

// fallBound is fragmentation's rawBound: the fall ScoreBound allows.
func fallBound(_, _, fall float64) float64 { return fall }

// scaled is the Value of a Raw that is a share: MaxScore times it.
func scaled(raw float64) float64 { return MaxScore * raw }

// centred is the Value of a Raw in GPUs of fragmentation: MaxScore/2 for a
// placement that changes none, a quarter of MaxScore per GPU either way.
func centred(raw float64) float64 { return MaxScore/2 + MaxScore/4*raw }

// noTie is the Tie of policies whose Raw ties rarely: 0.
func noTie(float64) float64 { return 0 }

// usedTie is fragmentation's Tie: the used share, so that among nodes
// whose fragmentation changes alike the fuller one wins, as under binpack.
func usedTie(used float64) float64 { return used }

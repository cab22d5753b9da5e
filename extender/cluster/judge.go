package cluster

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"
)

// ReasonNodeUnknown is the reason of a node the state does not know (yet),
// for a pod that asks for GPUs; the other reasons a node is turned away
// for are vgpu's: its readiness reasons and Fit's.
const ReasonNodeUnknown vgpu.Reason = "NodeUnknown"

// nodeUnknownMessage is ReasonNodeUnknown's message.
const nodeUnknownMessage = "node not in gpuslice-scheduler's cache yet"

// parallelThreshold is the node count from which JudgeAll and JudgeBest
// spread the nodes over the CPUs; chunkSize is how many nodes one worker
// takes at a time.
const (
	parallelThreshold = 256
	chunkSize         = 64
)

// Demand is the pod being placed, read once per call (DemandOf).
type Demand struct {
	UID types.UID
	Pod vgpu.PodDemand
	// Key identifies the pod's request and constraints: pods with equal
	// keys get equal verdicts on a node in one state (verdictCache).
	Key string
	// ForBind asks for the placement itself and a message that names the
	// node's GPUs (Reserve); Filter and Prioritize need the verdict, the
	// score and a reason only, and share cached verdicts.
	ForBind bool
	// self is the pod's own entry in the state, looked up once per call
	// that judges many nodes, when selfKnown (see entryLocked).
	self      *Entry
	selfKnown bool
}

// entryLocked returns the pod's own entry in st (nil when it counts
// nowhere). Callers hold st.mu.
func (d *Demand) entryLocked(st *State) *Entry {
	if d.selfKnown {
		return d.self
	}
	return st.pods[d.UID]
}

// WantsGPU reports whether the pod asks for any GPU; pods that do not fit
// every node and are never counted.
func (d *Demand) WantsGPU() bool { return len(d.Pod.Request.Containers) > 0 }

// DemandOf reads pod's demand (vgpu.DemandOf) for one call. Its error
// names the pod and the invalid values; the pod cannot be placed anywhere.
func DemandOf(pod *corev1.Pod) (Demand, error) {
	d, err := vgpu.DemandOf(pod)
	if err != nil {
		return Demand{}, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return Demand{UID: pod.UID, Pod: d, Key: fmt.Sprintf("%+v", d)}, nil
}

// Verdict is the outcome for one node: a plain value, copied into the
// callers' slices.
type Verdict struct {
	// Fits is true when the pod fits; Score is then its node score
	// (vgpu.Score: Filter passes the nodes that tie the best one, and
	// Prioritize answers its Value scaled), and, for a bind, Allocation is
	// set.
	Fits bool
	// Bounded marks an entry of a node's verdictCache that holds no
	// verdict: Score is then only a bound on the node's score for the
	// pod's shape (vgpu.NodeSummary.ScoreBoundByGPU), which JudgeBest
	// remembers rather than read the node's GPUs again.
	Bounded    bool
	Score      vgpu.NodeScore
	Allocation *vgpu.PodAllocation
	// Reason and Message say why not. Message is empty for a Fit reason
	// found without one (vgpu.FitOptions.ReasonOnly); Container then names
	// the container that does not fit, for vgpu.NeedMessage (Message).
	Reason    vgpu.Reason
	Message   string
	Container int
	// Unresolvable is true when evicting pods cannot make the pod fit.
	Unresolvable bool
	// Node is the index of the node judged (its place in the state, as
	// ChangeListener names nodes); -1 when it could not be judged (unknown
	// to the state, or judged by no state at all).
	Node int
}

// Rejected is a verdict turning the pod away for reason, with the message
// of format and args, judged on no node's state (Node -1).
func Rejected(reason vgpu.Reason, unresolvable bool, format string, args ...any) Verdict {
	return Verdict{Reason: reason, Message: fmt.Sprintf(format, args...), Unresolvable: unresolvable, Node: -1}
}

// NeedMessage is v's message for the pod of d: Message, or for a reason
// found without one, vgpu.NeedMessage of the reason and container, the
// same on every node (kube-scheduler counts equal messages together in the
// pod's FailedScheduling event).
func (v *Verdict) NeedMessage(d *Demand) string {
	if v.Message != "" {
		return v.Message
	}
	return vgpu.NeedMessage(d.Pod, &vgpu.FitError{Reason: v.Reason, Container: v.Container})
}

// evaluateLocked decides whether d fits node name now. Callers hold
// st.mu (read or write). Messages do not name the node: kube-scheduler
// counts equal messages together in the pod's FailedScheduling event.
//
// Filter and Prioritize verdicts come from the node's summary and are
// remembered per pod shape until the node changes, so Prioritize reuses
// what Filter found and the pods of a burst, which mostly share a shape,
// are judged once per node change rather than once per pod.
func (st *State) evaluateLocked(name string, d *Demand, now time.Time) Verdict {
	n := st.nodes[name]
	if n == nil || !n.known {
		if !d.WantsGPU() {
			// kube-scheduler judges its CPU and memory; unscored.
			return Verdict{Fits: true, Node: -1}
		}
		return Rejected(ReasonNodeUnknown, false, nodeUnknownMessage)
	}
	v := st.judgeLocked(n, d, now)
	v.Node = n.index
	return v
}

// judgeLocked is evaluateLocked on a known node.
func (st *State) judgeLocked(n *nodeState, d *Demand, now time.Time) Verdict {
	if v, decided := st.screenLocked(n, d, now); decided {
		return v
	}
	return st.fitLocked(n, d)
}

// screenLocked is what judgeLocked decides without fitting the pod on the
// node's GPUs: readiness, the pod's own earlier usage, a bind, the
// summary's Reject and a remembered verdict. decided is false when only
// fitLocked can tell; v is then empty, or a remembered bound (v.Bounded).
// Callers hold st.mu.
func (st *State) screenLocked(n *nodeState, d *Demand, now time.Time) (v Verdict, decided bool) {
	// A pod without GPUs needs no device plugin.
	if d.WantsGPU() {
		if v, ok := st.readinessLocked(n, now); !ok {
			return v, true
		}
	}
	if e := d.entryLocked(st); e != nil && e.node == n.name {
		// A pod's own earlier usage does not count against itself.
		usage := n.usage.Clone()
		usage.Remove(e.alloc, e.req)
		return toVerdict(vgpu.Fit(d.Pod, vgpu.NodeState{Inventory: n.inventory, Usage: usage, HostFree: n.hostFreeLocked()}, st.fitOptionsLocked(d))), true
	}
	if d.ForBind {
		return toVerdict(n.summary.Fit(d.Pod, st.fitOptionsLocked(d))), true
	}
	if r, ok := n.figures.Reject(d.Pod); ok {
		// Turned away by the summary alone: most full nodes.
		return Verdict{Reason: r, Unresolvable: r == vgpu.ReasonUnhealthy}, true
	}
	// Verdicts found before a new workload snapshot are stale until the
	// node's summary is rebuilt for it.
	if v, ok := n.verdicts.get(d.Key, n.gen); ok && n.summaryWorkload == st.workload {
		return v, !v.Bounded // a bound leaves the node undecided
	}
	return Verdict{}, false
}

// fitLocked fits d on n's summary, for a Filter or Prioritize that
// screenLocked left undecided, and remembers the verdict. Callers hold
// st.mu.
func (st *State) fitLocked(n *nodeState, d *Demand) Verdict {
	opts := st.fitOptionsLocked(d)
	// Only a bind needs the allocation, and binds fit afresh.
	opts.NoAllocation = true
	v := toVerdict(n.summary.Fit(d.Pod, opts))
	if n.summaryWorkload == st.workload {
		n.verdicts.put(d.Key, n.gen, v)
	}
	return v
}

// fitOptionsLocked are the options d is fitted with now. Callers hold
// st.mu.
func (st *State) fitOptionsLocked(d *Demand) vgpu.FitOptions {
	opts := st.opts.Fit
	opts.Workload = st.workload
	opts.Unscored, opts.ReasonOnly = d.ForBind, !d.ForBind
	return opts
}

// toVerdict turns Fit's answer into a verdict; a fitting scored placement
// gets its scaled score, and its allocation when it has containers.
func toVerdict(p vgpu.Placement, err error) Verdict {
	if err == nil {
		v := Verdict{Fits: true, Score: vgpu.Score(p)}
		if len(p.Allocation.Containers) > 0 {
			a := p.Allocation
			v.Allocation = &a
		}
		return v
	}
	// Fit returns its *FitError unwrapped; a type assertion, unlike
	// errors.As, costs no allocation per node turned away.
	fe, ok := err.(*vgpu.FitError) //nolint:errorlint // see above
	if !ok {
		return Rejected("", false, "%s", err.Error())
	}
	v := Verdict{Reason: fe.Reason, Message: fe.Message, Container: fe.Container}
	switch fe.Reason {
	case vgpu.ReasonUnhealthy, vgpu.ReasonModel, vgpu.ReasonUUID, vgpu.ReasonEnforcement:
		v.Unresolvable = true
	}
	return v
}

// verdictSlots is how many pod shapes a node remembers verdicts for.
const verdictSlots = 8

// verdictCache is a node's latest verdicts for a few pod shapes, each
// valid for one generation of the node. Safe for concurrent use: Filter's
// workers read and fill it under the state's read lock. The generations
// lie side by side, so that a lookup that finds none current (the first
// pod after the node changed) reads one cache line of them.
type verdictCache struct {
	mu   sync.Mutex
	next int
	gens [verdictSlots]uint64
	keys [verdictSlots]string
	vs   [verdictSlots]Verdict
}

// get returns the verdict for key at generation gen, if remembered.
func (c *verdictCache) get(key string, gen uint64) (Verdict, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, g := range c.gens {
		if g == gen && c.keys[i] == key {
			return c.vs[i], true
		}
	}
	return Verdict{}, false
}

// put remembers v for key at gen, replacing that key's older verdict or
// else the oldest entry.
func (c *verdictCache) put(key string, gen uint64, v Verdict) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.keys[:], key)
	if i < 0 {
		i = c.next
		c.next = (c.next + 1) % verdictSlots
	}
	c.gens[i], c.keys[i], c.vs[i] = gen, key, v
}

// readinessLocked reports whether the device plugin serves node n now, by
// vgpu.PluginReadiness of what its Node says (n.readiness) and of its
// heartbeat Lease. Callers hold st.mu.
func (st *State) readinessLocked(n *nodeState, now time.Time) (Verdict, bool) {
	maxAge := st.opts.HeartbeatMaxAge
	if n.readiness.Ready() && n.heartbeatFine && now.Sub(n.heartbeatRenewed) <= maxAge {
		return Verdict{}, true // what PluginReadiness says of a ready Node with a fresh, sound heartbeat
	}
	if r := vgpu.PluginReadiness(n.readiness, n.heartbeat(), now, maxAge, st.opts.HeartbeatNamespace); !r.Ready() {
		return unreadyVerdict(r), false
	}
	return Verdict{}, true
}

// Readiness is whether the device plugin serves node now, as judging a pod
// that asks for GPUs finds it (vgpu.PluginReadiness); a node the state does
// not know is not ready, for ReasonNodeUnknown.
func (st *State) Readiness(node string) vgpu.Readiness {
	now := st.now()
	st.mu.RLock()
	defer st.mu.RUnlock()
	n := st.nodes[node]
	if n == nil || !n.known {
		return vgpu.Readiness{Reason: ReasonNodeUnknown, Message: nodeUnknownMessage}
	}
	return vgpu.PluginReadiness(n.readiness, n.heartbeat(), now, st.opts.HeartbeatMaxAge, st.opts.HeartbeatNamespace)
}

// unreadyVerdict is the verdict of a node whose plugin does not serve it:
// no eviction helps.
func unreadyVerdict(r vgpu.Readiness) Verdict {
	return Verdict{Reason: r.Reason, Message: r.Message, Unresolvable: true, Node: -1}
}

// Judge judges d on node name now, under the state's read lock.
func (st *State) Judge(name string, d *Demand) Verdict {
	now := st.now()
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.evaluateLocked(name, d, now)
}

// JudgeAll calls fn(i, verdict) for each of names under one read lock,
// spread over the CPUs when there are many. fn is called concurrently for
// different i and must only write to slot i of its results.
func (st *State) JudgeAll(names []string, d *Demand, fn func(i int, v Verdict)) {
	st.lockJudging(d)
	defer st.unlockJudging(d)
	now := st.now()
	// The workers read the state under the read lock this goroutine holds
	// until they are done.
	forEach(len(names), func(i int) { fn(i, st.evaluateLocked(names[i], d, now)) })
}

// Judging calls fn under the state's read lock with a fits that judges at
// now whether a demand fits the node of an index (Verdict.Node); fits is
// valid only until fn returns, and fn must not call into the state. It is
// how code outside the state, such as retry.Tracker.Due, judges nodes
// without holding the state's lock itself.
func (st *State) Judging(now time.Time, fn func(fits func(d *Demand, node int) bool)) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	fn(func(d *Demand, node int) bool {
		return node < len(st.byIndex) && st.evaluateLocked(st.byIndex[node].name, d, now).Fits
	})
}

// lockJudging read-locks the state for judging d on many nodes and looks
// the pod's own entry up once, before workers share d; unlockJudging
// undoes both.
func (st *State) lockJudging(d *Demand) {
	st.mu.RLock()
	d.self, d.selfKnown = st.pods[d.UID], true
}

// unlockJudging undoes lockJudging.
func (st *State) unlockJudging(d *Demand) {
	d.self, d.selfKnown = nil, false
	st.mu.RUnlock()
}

// forEach calls fn(i) for i in 0..count-1, spread over the CPUs in chunks
// when count is large, and returns when every call has.
func forEach(count int, fn func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), (count+chunkSize-1)/chunkSize)
	if count < parallelThreshold || workers < 2 {
		for i := range count {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				start := int(next.Add(chunkSize)) - chunkSize
				if start >= count {
					return
				}
				for i := start; i < min(start+chunkSize, count); i++ {
					fn(i)
				}
			}
		})
	}
	wg.Wait()
}

// FitsElsewhere reports whether d fits now some node kube-scheduler did
// not send (those judged reports, by index; candidates how many), when those
// were a sample. With percentageOfNodesToScore below 100 kube-scheduler
// stops filtering once it has found a number of feasible nodes that
// depends only on the node count (SampleSize), and sends the extender only
// those; when none of them has room but another node has, the pod should
// be retried soon, with another sample, rather than wait for a change on
// the nodes it saw. A candidate list of any other length is every node
// kube-scheduler's own filters (node selectors, taints, CPU) let through,
// and the pod is not retried for nodes outside it. Verdicts are
// remembered, so the scan costs little beyond the first pod of a shape.
func (st *State) FitsElsewhere(d *Demand, judged func(node int) bool, candidates int) bool {
	now := st.now()
	st.mu.RLock()
	defer st.mu.RUnlock()
	if all := st.known; candidates >= all || candidates != SampleSize(st.opts.PercentageOfNodesToScore, all) {
		return false
	}
	for _, n := range st.byIndex {
		if !judged(n.index) && n.known && st.evaluateLocked(n.name, d, now).Fits {
			return true
		}
	}
	return false
}

// SampleSize is how many feasible nodes kube-scheduler looks for among
// all before it stops, for a profile's percentageOfNodesToScore (0:
// adaptive, 50% − all/125 but at least 5%; never fewer than 100 nodes).
// It follows kube-scheduler's numFeasibleNodesToFind.
func SampleSize(percentage, all int) int {
	const minNodes, minPercent = 100, 5
	if all < minNodes {
		return all
	}
	if percentage == 0 {
		percentage = max(50-all/125, minPercent)
	}
	return max(all*percentage/100, minNodes)
}

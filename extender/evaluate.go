package extender

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

// Reasons the extender turns a node away before it asks vgpu.Fit, beside
// vgpu's own Fit reasons. Every one but ReasonNodeUnknown and
// ReasonNotSynced means the device plugin is not serving the node (vgpu's
// readiness reasons), and its message starts with "plugin not ready: ".
// Counted by Scheduler.Rejections.
const (
	// ReasonNodeUnknown: the node is not (yet) in the extender's cache.
	ReasonNodeUnknown vgpu.Reason = "NodeUnknown"
	// ReasonNoInventory: the Node has no inventory annotation.
	ReasonNoInventory = vgpu.ReasonNoInventory
	// ReasonMalformedInventory: the inventory annotation does not parse,
	// or names another node.
	ReasonMalformedInventory = vgpu.ReasonMalformedInventory
	// ReasonReadyLabel: the ready label is missing or not "true".
	ReasonReadyLabel = vgpu.ReasonReadyLabel
	// ReasonNoAllocatable: the Node's allocatable resource is missing or 0.
	ReasonNoAllocatable = vgpu.ReasonNoAllocatable
	// ReasonNoHeartbeat: no heartbeat Lease, or one without renewTime.
	ReasonNoHeartbeat = vgpu.ReasonNoHeartbeat
	// ReasonStaleHeartbeat: the heartbeat Lease was renewed longer ago than
	// Config.HeartbeatMaxAge.
	ReasonStaleHeartbeat = vgpu.ReasonStaleHeartbeat
	// ReasonNotSynced: the extender's informers have not synced yet, so
	// it cannot tell what is free anywhere.
	ReasonNotSynced vgpu.Reason = "NotSynced"
	// ReasonNotRegistered: the heartbeat says the plugin is not registered
	// with the kubelet, or does not parse.
	ReasonNotRegistered = vgpu.ReasonNotRegistered
)

// notSyncedVerdict is every node's verdict before the informers synced.
var notSyncedVerdict = rejected(ReasonNotSynced, true, fieldManager+" not ready: informer caches not synced")

// parallelThreshold is the node count from which Filter and Prioritize
// spread the nodes over the CPUs; chunkSize is how many nodes one worker
// takes at a time.
const (
	parallelThreshold = 256
	chunkSize         = 64
)

// demand is the pod being placed, read once per call.
type demand struct {
	uid types.UID
	pod vgpu.PodDemand
	// key identifies the pod's request and constraints: pods with equal
	// keys get equal verdicts on a node in one state (verdictCache).
	key string
	// forBind asks for the placement itself and a message that names the
	// node's GPUs (Bind); Filter and Prioritize need the verdict, the
	// score and a reason only, and share cached verdicts.
	forBind bool
	// self is the pod's own entry in the state, looked up once per call
	// that judges many nodes, when selfKnown (see entryLocked).
	self      *podEntry
	selfKnown bool
}

// entryLocked returns the pod's own entry in st (nil when it counts
// nowhere). Callers hold st.mu.
func (d *demand) entryLocked(st *clusterState) *podEntry {
	if d.selfKnown {
		return d.self
	}
	return st.pods[d.uid]
}

// wantsGPU reports whether the pod asks for any GPU; pods that do not fit
// every node and are never counted.
func (d *demand) wantsGPU() bool { return len(d.pod.Request.Containers) > 0 }

// placesWithoutGPU reports whether Filter and Prioritize judge d, a pod
// that asks for no GPU, on each node rather than pass it everywhere: under
// a node policy that sends it where CPU is most in surplus over what the
// node's free GPUs will want (vgpu.Policy.RanksByCPUSurplus: fragmentation).
// kube-scheduler sends such pods only when the profile's extender manages
// no resources (the chart's scheduler.extender.placePodsWithoutGPU).
func (s *Scheduler) placesWithoutGPU(d *demand) bool {
	policy := d.pod.Constraints.NodePolicy
	if policy == "" {
		policy = s.cfg.NodePolicy
	}
	return !d.wantsGPU() && policy.RanksByCPUSurplus() && s.Ready()
}

// demandOf reads pod's demand (vgpu.DemandOf) for one call. Its error
// names the pod and the invalid values; the pod cannot be placed anywhere.
func demandOf(pod *corev1.Pod) (demand, error) {
	d, err := vgpu.DemandOf(pod)
	if err != nil {
		return demand{}, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return demand{uid: pod.UID, pod: d, key: fmt.Sprintf("%+v", d)}, nil
}

// verdict is the outcome for one node.
type verdict struct {
	// fits is true when the pod fits; score is then its node score
	// (vgpu.Score: Filter passes the nodes that tie the best one, and
	// Prioritize answers its Value scaled), and, for a bind, allocation is
	// set.
	fits bool
	// bounded marks an entry of a node's verdictCache that holds no
	// verdict: score is then only a bound on the node's score for the
	// pod's shape (vgpu.NodeSummary.ScoreBoundByGPU), which evaluateBest
	// remembers rather than read the node's GPUs again.
	bounded    bool
	score      vgpu.NodeScore
	allocation *vgpu.PodAllocation
	// reason and message say why not. message is empty for a Fit reason
	// found without one (vgpu.FitOptions.ReasonOnly); container then names
	// the container that does not fit, for vgpu.NeedMessage.
	reason    vgpu.Reason
	message   string
	container int
	// unresolvable is true when evicting pods cannot make the pod fit.
	unresolvable bool
	// node is the index of the node judged (nodeState.index); -1 when it
	// could not be judged (unknown to the cache, caches not synced).
	node int
}

func rejected(reason vgpu.Reason, unresolvable bool, format string, args ...any) verdict {
	return verdict{reason: reason, message: fmt.Sprintf(format, args...), unresolvable: unresolvable, node: -1}
}

// evaluateLocked decides whether d fits node name now. Callers hold
// st.mu (read or write). Messages do not name the node: kube-scheduler
// counts equal messages together in the pod's FailedScheduling event.
//
// Filter and Prioritize verdicts come from the node's summary and are
// remembered per pod shape until the node changes, so Prioritize reuses
// what Filter found and the pods of a burst, which mostly share a shape,
// are judged once per node change rather than once per pod.
func (s *Scheduler) evaluateLocked(name string, d *demand, now time.Time) verdict {
	n := s.state.nodes[name]
	if n == nil || !n.known {
		if !d.wantsGPU() {
			// kube-scheduler judges its CPU and memory; unscored.
			return verdict{fits: true, node: -1}
		}
		return rejected(ReasonNodeUnknown, false, "node not in gpuslice-scheduler's cache yet")
	}
	v := s.judgeLocked(n, d, now)
	v.node = n.index
	return v
}

// judgeLocked is evaluateLocked on a known node.
func (s *Scheduler) judgeLocked(n *nodeState, d *demand, now time.Time) verdict {
	if v, decided := s.screenLocked(n, d, now); decided {
		return v
	}
	return s.fitLocked(n, d)
}

// screenLocked is what judgeLocked decides without fitting the pod on the
// node's GPUs: readiness, the pod's own earlier usage, a bind, the
// summary's Reject and a remembered verdict. decided is false when only
// fitLocked can tell; v is then empty, or a remembered bound (v.bounded).
// Callers hold st.mu.
func (s *Scheduler) screenLocked(n *nodeState, d *demand, now time.Time) (v verdict, decided bool) {
	st := s.state
	// A pod without GPUs needs no device plugin.
	if d.wantsGPU() {
		if v, ok := s.readinessLocked(n, now); !ok {
			return v, true
		}
	}
	if e := d.entryLocked(st); e != nil && e.node == n.name {
		// A pod's own earlier usage does not count against itself.
		usage := n.usage.Clone()
		usage.Remove(e.alloc, e.req)
		return toVerdict(vgpu.Fit(d.pod, vgpu.NodeState{Inventory: n.inventory, Usage: usage, HostFree: n.hostFreeLocked()}, s.fitOptionsLocked(d))), true
	}
	if d.forBind {
		return toVerdict(n.summary.Fit(d.pod, s.fitOptionsLocked(d))), true
	}
	if r, ok := n.figures.Reject(d.pod); ok {
		// Turned away by the summary alone: most full nodes.
		return verdict{reason: r, unresolvable: r == vgpu.ReasonUnhealthy}, true
	}
	// Verdicts found before a new workload snapshot are stale until the
	// node's summary is rebuilt for it.
	if v, ok := n.verdicts.get(d.key, n.gen); ok && n.summaryWorkload == st.workload {
		return v, !v.bounded // a bound leaves the node undecided
	}
	return verdict{}, false
}

// fitLocked fits d on n's summary, for a Filter or Prioritize that
// screenLocked left undecided, and remembers the verdict. Callers hold
// st.mu.
func (s *Scheduler) fitLocked(n *nodeState, d *demand) verdict {
	opts := s.fitOptionsLocked(d)
	// Only a bind needs the allocation, and binds fit afresh.
	opts.NoAllocation = true
	v := toVerdict(n.summary.Fit(d.pod, opts))
	if n.summaryWorkload == s.state.workload {
		n.verdicts.put(d.key, n.gen, v)
	}
	return v
}

// fitOptionsLocked are the options d is fitted with now. Callers hold
// st.mu.
func (s *Scheduler) fitOptionsLocked(d *demand) vgpu.FitOptions {
	opts := s.fitOptions
	opts.Workload = s.state.workload
	opts.Unscored, opts.ReasonOnly = d.forBind, !d.forBind
	return opts
}

// toVerdict turns Fit's answer into a verdict; a fitting scored placement
// gets its scaled score, and its allocation when it has containers.
func toVerdict(p vgpu.Placement, err error) verdict {
	if err == nil {
		v := verdict{fits: true, score: vgpu.Score(p)}
		if len(p.Allocation.Containers) > 0 {
			a := p.Allocation
			v.allocation = &a
		}
		return v
	}
	// Fit returns its *FitError unwrapped; a type assertion, unlike
	// errors.As, costs no allocation per node turned away.
	fe, ok := err.(*vgpu.FitError) //nolint:errorlint // see above
	if !ok {
		return rejected("", false, "%s", err.Error())
	}
	v := verdict{reason: fe.Reason, message: fe.Message, container: fe.Container}
	switch fe.Reason {
	case vgpu.ReasonUnhealthy, vgpu.ReasonModel, vgpu.ReasonUUID, vgpu.ReasonEnforcement:
		v.unresolvable = true
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
	vs   [verdictSlots]verdict
}

// get returns the verdict for key at generation gen, if remembered.
func (c *verdictCache) get(key string, gen uint64) (verdict, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, g := range c.gens {
		if g == gen && c.keys[i] == key {
			return c.vs[i], true
		}
	}
	return verdict{}, false
}

// put remembers v for key at gen, replacing that key's older verdict or
// else the oldest entry.
func (c *verdictCache) put(key string, gen uint64, v verdict) {
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
func (s *Scheduler) readinessLocked(n *nodeState, now time.Time) (verdict, bool) {
	maxAge := s.cfg.HeartbeatMaxAge.Duration
	if n.readiness.Ready() && n.heartbeatFine && now.Sub(n.heartbeatRenewed) <= maxAge {
		return verdict{}, true // what PluginReadiness says of a ready Node with a fresh, sound heartbeat
	}
	if r := vgpu.PluginReadiness(n.readiness, n.heartbeat(), now, maxAge, s.cfg.HeartbeatNamespace); !r.Ready() {
		return unreadyVerdict(r), false
	}
	return verdict{}, true
}

// unreadyVerdict is the verdict of a node whose plugin does not serve it:
// no eviction helps.
func unreadyVerdict(r vgpu.Readiness) verdict {
	return verdict{reason: r.Reason, message: r.Message, unresolvable: true, node: -1}
}

// evaluateAll calls fn(i, verdict) for each of names under one read lock,
// spread over the CPUs when there are many. fn is called concurrently for
// different i and must only write to slot i of its results.
func (s *Scheduler) evaluateAll(names []string, d *demand, fn func(i int, v verdict)) {
	s.lockJudging(d)
	defer s.unlockJudging(d)
	now := s.clock.Now()
	// The workers read the state under the read lock this goroutine holds
	// until they are done.
	forEach(len(names), func(i int) { fn(i, s.evaluateLocked(names[i], d, now)) })
}

// judging calls fn under the state's read lock with a fits that judges at
// now whether a demand fits the node of an index (nodeState.index); fits
// is valid only until fn returns. It is how code outside the state, such
// as retry.Tracker.Due, judges nodes without taking the state's lock.
func (s *Scheduler) judging(now time.Time, fn func(fits func(d *demand, node int) bool)) {
	st := s.state
	st.mu.RLock()
	defer st.mu.RUnlock()
	fn(func(d *demand, node int) bool {
		return node < len(st.byIndex) && s.evaluateLocked(st.byIndex[node].name, d, now).fits
	})
}

// lockJudging read-locks the state for judging d on many nodes and looks
// the pod's own entry up once, before workers share d; unlockJudging
// undoes both.
func (s *Scheduler) lockJudging(d *demand) {
	s.state.mu.RLock()
	d.self, d.selfKnown = s.state.pods[d.uid], true
}

// unlockJudging undoes lockJudging.
func (s *Scheduler) unlockJudging(d *demand) {
	d.self, d.selfKnown = nil, false
	s.state.mu.RUnlock()
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

package extender

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/extender/cluster"
	"github.com/gpuslice/gpuslice/extender/retry"
	"github.com/gpuslice/gpuslice/vgpu"
)

// ErrBadArgs is wrapped by the errors Filter, Prioritize and Bind return for
// arguments no kube-scheduler sends (no pod, no node list, an empty name);
// the HTTP layer answers 400 with the message.
var ErrBadArgs = errors.New("bad extender arguments")

// Reasons the extender turns a node away before it asks vgpu.Fit, beside
// vgpu's own Fit reasons. Every one but ReasonNodeUnknown and
// ReasonNotSynced means the device plugin is not serving the node (vgpu's
// readiness reasons), and its message starts with "plugin not ready: ".
// Counted by Scheduler.Rejections.
const (
	// ReasonNodeUnknown: the node is not (yet) in the extender's cache.
	ReasonNodeUnknown = cluster.ReasonNodeUnknown
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

// notSyncedVerdict is every node's verdict before the informers synced:
// Filter's answer then, not a judgement of any node.
var notSyncedVerdict = cluster.Rejected(ReasonNotSynced, true, fieldManager+" not ready: informer caches not synced")

// placesWithoutGPU reports whether Filter and Prioritize judge d, a pod
// that asks for no GPU, on each node rather than pass it everywhere: under
// a node policy that sends it where CPU is most in surplus over what the
// node's free GPUs will want (vgpu.Policy.RanksByCPUSurplus: fragmentation).
// kube-scheduler sends such pods only when the profile's extender manages
// no resources (the chart's scheduler.extender.placePodsWithoutGPU).
func (s *Scheduler) placesWithoutGPU(d *cluster.Demand) bool {
	policy := d.Pod.Constraints.NodePolicy
	if policy == "" {
		policy = s.cfg.NodePolicy
	}
	return !d.WantsGPU() && policy.RanksByCPUSurplus() && s.Ready()
}

// candidates returns the node names of args: NodeNames when kube-scheduler
// runs with nodeCacheCapable, else the names of Nodes.
func candidates(args *extenderv1.ExtenderArgs) ([]string, error) {
	switch {
	case args == nil || args.Pod == nil:
		return nil, fmt.Errorf("%w: Pod is required", ErrBadArgs)
	case args.NodeNames != nil:
		return *args.NodeNames, nil
	case args.Nodes != nil:
		names := make([]string, len(args.Nodes.Items))
		for i := range args.Nodes.Items {
			names[i] = args.Nodes.Items[i].Name
		}
		return names, nil
	}
	return nil, fmt.Errorf("%w: one of NodeNames and Nodes is required", ErrBadArgs)
}

// Filter keeps the candidate nodes where the pod fits now, for
// kube-scheduler's filterVerb; with Config.FilterResult best (the default)
// only those of them that tie the best node-policy score (vgpu.Score by
// NodeScore.Compare: Value 0..100, then Raw and Tie; Prioritize answers
// Value on 0..10): the others are left out of the answer, neither passed
// nor failed; many of them are not even fitted, as their score bound is
// below the best value found (cluster.State.JudgeBest), so
// while the pod fits somewhere FailedNodes and the rejection counters
// cover only the nodes judged. When it fits nowhere every node is judged.
// The answer has the same form as the
// question: NodeNames when args had NodeNames (nodeCacheCapable), else
// Nodes with the passing items of args.Nodes. Nodes turned away are in
// FailedAndUnresolvableNodes when evicting pods cannot help (the device
// plugin is not serving the node; too few healthy GPUs of the wanted model
// or UUID), else in FailedNodes, each with a message for the pod's
// FailedScheduling event. A pod with an invalid GPU request or placement
// annotation gets Error and no node. A pod that asks for no GPU passes
// every node.
//
// Before the informers synced, every node is turned away as unresolvable
// (ReasonNotSynced): the state may lack bound pods, and answering from it
// could give one slice twice. The pod is retried once they have synced.
//
// Filter reads the informers' state only (no API call), changes nothing but
// the rejection counters and is safe to call concurrently. The error is
// non-nil, wrapping ErrBadArgs, only for arguments kube-scheduler never
// sends.
func (s *Scheduler) Filter(ctx context.Context, args *extenderv1.ExtenderArgs) (*extenderv1.ExtenderFilterResult, error) {
	a, err := s.filter(ctx, args)
	if err != nil {
		return nil, err
	}
	defer a.release()
	return a.result(args), nil
}

// filter is Filter's judgement as slices (filterAnswer), which the HTTP
// codec writes without building Filter's maps. The caller releases the
// answer once it is written.
func (s *Scheduler) filter(ctx context.Context, args *extenderv1.ExtenderArgs) (*filterAnswer, error) {
	names, err := candidates(args)
	if err != nil {
		return nil, err
	}
	a := newFilterAnswer(names)
	d, err := cluster.DemandOf(args.Pod)
	if err != nil {
		a.err = err.Error()
		return a, nil
	}
	// Every slot is written below; the slice goes back to the pool when
	// the answer is built (it holds no state the answer points to but
	// strings).
	buf := verdictPool.Get().(*[]cluster.Verdict)
	defer verdictPool.Put(buf)
	if cap(*buf) < len(names) {
		*buf = make([]cluster.Verdict, len(names))
	}
	verdicts := (*buf)[:len(names)]
	seen := s.retries.Seen()
	switch {
	case d.WantsGPU() && !s.Ready():
		// Without every bound pod counted, full GPUs would look free.
		for i := range verdicts {
			verdicts[i] = notSyncedVerdict
		}
	case d.WantsGPU() && s.cfg.FilterResult == FilterResultBest:
		s.state.JudgeBest(names, &d, verdicts)
	case d.WantsGPU(), s.placesWithoutGPU(&d):
		s.state.JudgeAll(names, &d, func(i int, v cluster.Verdict) { verdicts[i] = v })
	default:
		for i := range verdicts {
			verdicts[i] = cluster.Verdict{Fits: true}
		}
	}
	var best *vgpu.NodeScore // nil: every fitting node passes
	if s.cfg.FilterResult == FilterResultBest {
		best = bestScore(verdicts)
	}
	counts := map[vgpu.Reason]int64{}
	needs := map[needKey]string{}
	for i, v := range verdicts {
		outcome := outcomeOf(&v, best)
		switch outcome {
		case outcomeLeftOut:
			continue
		case outcomePassed:
			a.passed = append(a.passed, i)
			continue
		}
		msg := v.Message
		if msg == "" {
			// One message per reason and container, the same on every
			// node, so kube-scheduler's event counts them together.
			k := needKey{v.Reason, v.Container}
			if msg = needs[k]; msg == "" {
				msg = v.NeedMessage(&d)
				needs[k] = msg
			}
		}
		if outcome == outcomeUnresolvable {
			a.unresolvable = append(a.unresolvable, failedNode{i, msg})
		} else {
			a.failed = append(a.failed, failedNode{i, msg})
		}
		counts[v.Reason]++
	}
	s.rejections.add(counts)
	// A pod that passed some node is placed there (kube-scheduler sends
	// only nodes its own filters passed); one that passed none waits.
	if len(a.passed) == 0 && len(counts) > 0 {
		var rej retry.Rejection
		for _, v := range verdicts {
			if v.Node < 0 {
				rej.Unjudged = true
			} else {
				rej.Add(v.Node, v.Reason)
			}
		}
		if s.Ready() {
			rej.Elsewhere = s.state.FitsElsewhere(&d, rej.Judged, len(names))
		}
		s.retries.Rejected(args.Pod, d, seen, rej)
	} else {
		s.retries.Forget(args.Pod.UID)
	}
	klog.FromContext(ctx).V(4).Info("Filtered", "pod", klog.KObj(args.Pod), "candidates", len(names), "passed", len(a.passed))
	return a, nil
}

// filterOutcome is where Filter's answer puts a node, by its verdict.
type filterOutcome int

const (
	// outcomePassed: the pod fits and the node ties the best score.
	outcomePassed filterOutcome = iota
	// outcomeLeftOut: the pod fits, but the node scores below the best
	// score; neither passed nor failed.
	outcomeLeftOut
	// outcomeFailed and outcomeUnresolvable: in FailedNodes and in
	// FailedAndUnresolvableNodes.
	outcomeFailed
	outcomeUnresolvable
)

// outcomeOf is v's outcome when best is the best score (nil: every
// fitting node passes).
func outcomeOf(v *cluster.Verdict, best *vgpu.NodeScore) filterOutcome {
	switch {
	case v.Fits && (best == nil || v.Score.Compare(*best) >= 0):
		return outcomePassed
	case v.Fits:
		return outcomeLeftOut
	case v.Unresolvable:
		return outcomeUnresolvable
	}
	return outcomeFailed
}

// bestScore returns the best score (vgpu.NodeScore.Compare) among the
// fitting verdicts, the first of those that tie; nil when none fits.
func bestScore(verdicts []cluster.Verdict) *vgpu.NodeScore {
	var best vgpu.NodeScore
	found := false
	for i := range verdicts {
		if v := &verdicts[i]; v.Fits {
			if !found || v.Score.Compare(best) > 0 {
				best, found = v.Score, true
			}
		}
	}
	if !found {
		return nil
	}
	return &best
}

// Prioritize scores the candidate nodes for kube-scheduler's
// prioritizeVerb, in the order of args: vgpu.Score of the pod's placement
// under the node policy, scaled from 0..vgpu.MaxScore to
// 0..extenderv1.MaxExtenderPriority. Nodes where the pod does not fit, and
// every node for a pod that asks for no GPU or asks invalidly, or before
// the informers synced, score 0.
// Like Filter it reads the informers' state only and is safe to call
// concurrently; the error wraps ErrBadArgs.
func (s *Scheduler) Prioritize(ctx context.Context, args *extenderv1.ExtenderArgs) (extenderv1.HostPriorityList, error) {
	names, err := candidates(args)
	if err != nil {
		return nil, err
	}
	list := make(extenderv1.HostPriorityList, len(names))
	for i, name := range names {
		list[i].Host = name
	}
	d, err := cluster.DemandOf(args.Pod)
	if err != nil || !d.WantsGPU() && !s.placesWithoutGPU(&d) || !s.Ready() {
		return list, nil
	}
	s.state.JudgeAll(names, &d, func(i int, v cluster.Verdict) {
		if v.Fits {
			list[i].Score = scaleScore(v.Score.Value)
		}
	})
	klog.FromContext(ctx).V(5).Info("Prioritized", "pod", klog.KObj(args.Pod), "scores", list)
	return list, nil
}

// verdictPool holds Filter's per-node verdict slices between calls: at
// thousands of nodes they are most of what a call allocates.
var verdictPool = sync.Pool{New: func() any { return new([]cluster.Verdict) }}

// needKey names a reason-only Fit verdict's message: the reason and the
// container.
type needKey struct {
	reason    vgpu.Reason
	container int
}

// scaleScore maps 0..vgpu.MaxScore onto 0..extenderv1.MaxExtenderPriority,
// rounding half up.
func scaleScore(value int) int64 {
	const maxScore = int64(vgpu.MaxScore)
	v := min(max(int64(value), 0), maxScore)
	return (v*extenderv1.MaxExtenderPriority + maxScore/2) / maxScore
}

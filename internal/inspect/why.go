package inspect

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/extender/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// ReasonInvalidRequest means the pod's GPU request or placement annotations do
// not parse; it fits nowhere.
const ReasonInvalidRequest vgpu.Reason = "InvalidRequest"

// NodeVerdict is one node's answer to a pod.
type NodeVerdict struct {
	Node string `json:"node"`
	Fits bool   `json:"fits"`
	// Reason and Message say why not, as the extender's Filter says it
	// to kube-scheduler; empty when it fits. Detail, when set, says it
	// naming the node's GPUs (Bind's message).
	Reason  vgpu.Reason `json:"reason,omitempty"`
	Message string      `json:"message,omitempty"`
	Detail  string      `json:"detail,omitempty"`
	// GPUs are the UUIDs the pod would get when it fits.
	GPUs []string `json:"gpus,omitempty"`
}

// WhyReport explains where one pod can go.
type WhyReport struct {
	// Pod is "namespace/name".
	Pod string `json:"pod"`
	// BoundTo is the node the pod is bound to; the verdicts are then empty.
	BoundTo string `json:"boundTo,omitempty"`
	// Scheduler is kube-scheduler's last verdict (the False PodScheduled
	// condition's message); empty when there is none.
	Scheduler string `json:"scheduler,omitempty"`
	// Nodes are every node's verdict, by name.
	Nodes []NodeVerdict `json:"nodes"`
	// Closest is the node that turned the pod away the latest in Fit's
	// order of filters, the most free memory breaking ties; empty when
	// some node fits or none was judged by Fit.
	Closest string `json:"closest,omitempty"`
}

// Why judges pod on every node of s through the scheduler extender's own
// judge (extender/cluster): a State fed the snapshot's Nodes, heartbeat
// Leases and pods, as the extender's informers feed it, judging with the
// extender's policies and heartbeat age, so each node's reason and message
// are those the extender's Filter gives kube-scheduler. Detail is the
// message a fit on the node's GPUs gives (naming them), where it says
// more. The extender's settings come from the chart's scheduler ConfigMap
// when s has one, else its defaults.
func Why(s *Snapshot, pod *corev1.Pod) WhyReport {
	r := WhyReport{Pod: pod.Namespace + "/" + pod.Name, Nodes: []NodeVerdict{}}
	if c := podScheduled(pod); c != nil {
		r.Scheduler = c.Message
	}
	if pod.Spec.NodeName != "" {
		r.BoundTo = pod.Spec.NodeName
		return r
	}
	st := s.judge()
	demand, derr := cluster.DemandOf(pod)
	placement := demand
	placement.ForBind = true
	type near struct {
		stage int
		free  int64
	}
	best, bestNode := near{stage: -1}, ""
	for i := range s.Nodes {
		n := &s.Nodes[i]
		v := NodeVerdict{Node: n.Name}
		switch {
		case derr != nil && unready(st, n.Name, &v):
		case derr != nil:
			// The pod's request as vgpu says it, without the pod's name.
			v.Reason, v.Message = ReasonInvalidRequest, errors.Unwrap(derr).Error()
		default:
			verdict := st.Judge(n.Name, &demand)
			v.Fits = verdict.Fits
			if !v.Fits {
				v.Reason, v.Message = verdict.Reason, verdict.NeedMessage(&demand)
			}
			// The placement, or the message naming the node's GPUs,
			// as Bind's fit finds them.
			p := st.Judge(n.Name, &placement)
			switch {
			case v.Fits && p.Allocation != nil:
				for _, c := range p.Allocation.Containers {
					for _, g := range c.GPUs {
						v.GPUs = append(v.GPUs, g.UUID)
					}
				}
			case !v.Fits && p.Message != v.Message:
				v.Detail = p.Message
			}
			if stage := fitStage(v.Reason); !v.Fits && stage >= 0 {
				view, _ := st.Node(n.Name)
				if nr := (near{stage: stage, free: largestFree(view.Inventory, st.Usage(n.Name))}); nr.stage > best.stage || nr.stage == best.stage && nr.free > best.free {
					best, bestNode = nr, n.Name
				}
			}
		}
		r.Nodes = append(r.Nodes, v)
	}
	if !slices.ContainsFunc(r.Nodes, func(v NodeVerdict) bool { return v.Fits }) {
		r.Closest = bestNode
	}
	return r
}

// unready fills v and returns true when the extender would turn node
// away whatever the pod asks: its plugin does not serve it.
func unready(st *cluster.State, node string, v *NodeVerdict) bool {
	r := st.Readiness(node)
	v.Reason, v.Message = r.Reason, r.Message
	return !r.Ready()
}

// judge is a cluster.State fed s, as the extender's informers feed its
// own: every Node, heartbeat Lease and pod, with the extender's settings.
func (s *Snapshot) judge() *cluster.State {
	fit, maxAge := s.extenderSettings()
	now := s.Now
	st := cluster.New(cluster.Options{
		ResourceName: vgpu.ResourceGPU, Now: func() time.Time { return now },
		HeartbeatMaxAge: maxAge, HeartbeatNamespace: s.HeartbeatNamespace,
		Fit: fit, Workload: vgpu.DefaultWorkload(),
	})
	for i := range s.Nodes {
		st.UpsertNode(&s.Nodes[i])
	}
	// The snapshot keys each heartbeat Lease by the node it stands for.
	for node, l := range s.Leases {
		l.Name = vgpu.HeartbeatLeaseName(node)
		st.UpsertLease(&l)
	}
	for i := range s.Pods {
		_ = st.UpsertPod(&s.Pods[i]) // an invalid allocation counts nowhere, as in the extender
	}
	st.Synced()
	return st
}

// extenderSettings returns the Fit options and heartbeat age of the
// chart's extender configuration, or the extender's defaults.
func (s *Snapshot) extenderSettings() (vgpu.FitOptions, time.Duration) {
	opts, maxAge := vgpu.FitOptions{}, vgpu.DefaultHeartbeatMaxAge
	for i := range s.ConfigMaps {
		sc, err := parseSchedulerConfig(&s.ConfigMaps[i])
		if err != nil {
			continue
		}
		opts.NodePolicy, opts.GPUPolicy = sc.extender.NodePolicy, sc.extender.GPUPolicy
		if d, err := time.ParseDuration(sc.extender.HeartbeatMaxAge); err == nil {
			maxAge = d
		}
	}
	return opts, maxAge
}

// fitStage is how far into Fit's filters a reason comes (FitError order).
func fitStage(r vgpu.Reason) int {
	return slices.Index([]vgpu.Reason{
		vgpu.ReasonUnhealthy, vgpu.ReasonModel, vgpu.ReasonUUID, vgpu.ReasonNoFreeSlice,
		vgpu.ReasonInsufficientMemory, vgpu.ReasonInsufficientCores, vgpu.ReasonNUMA,
	}, r)
}

// largestFree is the most schedulable memory free on one healthy GPU.
func largestFree(inv vgpu.NodeInventory, u *vgpu.NodeUsage) int64 {
	var best int64
	for _, g := range inv.GPUs {
		if g.Health == vgpu.Healthy {
			best = max(best, g.SchedulableMemoryMiB-u.GPU(g.UUID).MemoryMiB)
		}
	}
	return best
}

// RenderWhy writes r: one line per node with its verdict, then the
// closest fit.
func RenderWhy(w io.Writer, r WhyReport) error {
	if r.BoundTo != "" {
		_, err := fmt.Fprintf(w, "pod %s is bound to node %s: it is not pending (kubectl gpuslice status --node %s shows its GPUs)\n", r.Pod, r.BoundTo, r.BoundTo)
		return err
	}
	fmt.Fprintf(w, "pod %s\n", r.Pod)
	if r.Scheduler != "" {
		fmt.Fprintf(w, "kube-scheduler: %s\n", r.Scheduler)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tVERDICT\tREASON\tDETAIL")
	var fits []string
	for _, v := range r.Nodes {
		if v.Fits {
			fits = append(fits, v.Node)
			fmt.Fprintf(tw, "%s\tfits\t-\tGPUs %s\n", v.Node, strings.Join(v.GPUs, ","))
			continue
		}
		fmt.Fprintf(tw, "%s\trejected\t%s\t%s\n", v.Node, v.Reason, v.detail())
	}
	if len(r.Nodes) == 0 {
		fmt.Fprintln(tw, "(no nodes)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case len(fits) > 0:
		_, err := fmt.Fprintf(w, "\nfits now on %s as far as gpuslice is concerned: kube-scheduler's own filters (CPU, memory, taints, affinity) or its back-off hold the pod; see the kube-scheduler line above\n", strings.Join(fits, ", "))
		return err
	case r.Closest != "":
		for _, v := range r.Nodes {
			if v.Node == r.Closest {
				_, err := fmt.Fprintf(w, "\nclosest fit: %s (%s: %s)\n", v.Node, v.Reason, v.detail())
				return err
			}
		}
	}
	return nil
}

// detail is v's Detail, else its Message.
func (v *NodeVerdict) detail() string {
	if v.Detail != "" {
		return v.Detail
	}
	return v.Message
}

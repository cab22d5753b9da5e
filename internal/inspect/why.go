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

	"github.com/gpuslice/gpuslice/vgpu"
)

// ReasonInvalidRequest means the pod's GPU request or placement annotations do
// not parse; it fits nowhere.
const ReasonInvalidRequest vgpu.Reason = "InvalidRequest"

// NodeVerdict is one node's answer to a pod.
type NodeVerdict struct {
	Node string `json:"node"`
	Fits bool   `json:"fits"`
	// Reason and Message say why not; empty when it fits.
	Reason  vgpu.Reason `json:"reason,omitempty"`
	Message string      `json:"message,omitempty"`
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

// Why judges pod on every node of s as the scheduler extender does: the
// extender's readiness checks (inventory, ready label, allocatable,
// heartbeat Lease no older than the extender's heartbeatMaxAge) and then
// vgpu.Fit with the extender's policies, with what the pods placed on the
// node hold. The extender's settings come from the chart's scheduler
// ConfigMap when s has one, else its defaults.
func Why(s *Snapshot, pod *corev1.Pod) WhyReport {
	r := WhyReport{Pod: pod.Namespace + "/" + pod.Name, Nodes: []NodeVerdict{}}
	if c := podScheduled(pod); c != nil {
		r.Scheduler = c.Message
	}
	if pod.Spec.NodeName != "" {
		r.BoundTo = pod.Spec.NodeName
		return r
	}
	opts, maxAge := s.extenderSettings()
	d, derr := vgpu.DemandOf(pod)
	placed := s.placed()
	type near struct {
		stage int
		free  int64
	}
	best, bestNode := near{stage: -1}, ""
	for i := range s.Nodes {
		n := &s.Nodes[i]
		v := NodeVerdict{Node: n.Name}
		inv, invErr := inventoryOf(n)
		switch {
		case s.unready(n, invErr, maxAge, &v):
		case derr != nil:
			v.Reason, v.Message = ReasonInvalidRequest, derr.Error()
		default:
			usage := usageOf(placed[n.Name], r.Pod)
			p, err := vgpu.Fit(d, vgpu.NodeState{Inventory: inv, Usage: usage}, opts)
			var fe *vgpu.FitError
			switch {
			case err == nil:
				v.Fits = true
				for _, c := range p.Allocation.Containers {
					for _, g := range c.GPUs {
						v.GPUs = append(v.GPUs, g.UUID)
					}
				}
			case errors.As(err, &fe):
				v.Reason, v.Message = fe.Reason, fe.Message
				if nr := (near{stage: fitStage(fe.Reason), free: largestFree(inv, usage)}); nr.stage > best.stage || nr.stage == best.stage && nr.free > best.free {
					best, bestNode = nr, n.Name
				}
			default:
				v.Message = err.Error()
			}
		}
		r.Nodes = append(r.Nodes, v)
	}
	if !slices.ContainsFunc(r.Nodes, func(v NodeVerdict) bool { return v.Fits }) {
		r.Closest = bestNode
	}
	return r
}

// unready fills v and returns true when the extender would turn node n
// away before Fit: vgpu.PluginReadiness of the Node and its heartbeat
// Lease, as the extender judges them.
func (s *Snapshot) unready(n *corev1.Node, invErr error, maxAge time.Duration, v *NodeVerdict) bool {
	label, hasLabel := n.Labels[vgpu.LabelGPUReady]
	allocQ := n.Status.Allocatable[vgpu.ResourceGPU]
	node := vgpu.NodeReadiness(invErr, label, hasLabel, allocQ.Value(), vgpu.ResourceGPU)
	r := vgpu.PluginReadiness(node, s.heartbeat(n.Name), s.Now, maxAge, s.HeartbeatNamespace)
	v.Reason, v.Message = r.Reason, r.Message
	return !r.Ready()
}

// heartbeat is node's heartbeat Lease as vgpu.HeartbeatReadiness reads it.
func (s *Snapshot) heartbeat(node string) vgpu.Heartbeat {
	l, ok := s.Leases[node]
	if !ok {
		return vgpu.Heartbeat{}
	}
	h := vgpu.Heartbeat{Exists: true}
	if l.Spec.RenewTime != nil {
		h.RenewTime = l.Spec.RenewTime.Time
	}
	if h.Raw = l.Annotations[vgpu.AnnotationPluginHeartbeat]; h.Raw != "" {
		h.Parsed, h.Err = vgpu.ParsePluginHeartbeat(h.Raw)
	}
	return h
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
		fmt.Fprintf(tw, "%s\trejected\t%s\t%s\n", v.Node, v.Reason, v.Message)
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
				_, err := fmt.Fprintf(w, "\nclosest fit: %s (%s: %s)\n", v.Node, v.Reason, v.Message)
				return err
			}
		}
	}
	return nil
}

package inspect

import (
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Result is the verdict of one check.
type Result string

// The results: PASS is as it should be, WARN may explain a problem, FAIL
// stops GPU pods from being placed or run (doctor exits 1).
const (
	Pass Result = "PASS"
	Warn Result = "WARN"
	Fail Result = "FAIL"
)

// Check is one line of doctor's checklist.
type Check struct {
	// Node is the node checked; empty for a cluster-wide check.
	Node string `json:"node,omitempty"`
	// Name identifies the check ("heartbeat", "webhook-admission").
	Name   string `json:"name"`
	Result Result `json:"result"`
	// Message says what was found; Fix what to do about a WARN or FAIL.
	Message string `json:"message"`
	Fix     string `json:"fix,omitempty"`
}

// Report is doctor's checklist: the node checks of each node in order,
// then the cluster checks.
type Report struct {
	Checks   []Check `json:"checks"`
	Warnings int     `json:"warnings"`
	Failures int     `json:"failures"`
}

// devicePluginGracePeriod is how long the kubelet keeps a resource's
// capacity after its plugin's endpoint stopped, with allocatable 0
// (the device manager's endpointStopGracePeriod).
const devicePluginGracePeriod = 5 * time.Minute

// defaultLeaseDuration is the heartbeat Lease duration assumed when a
// Lease has none: the device plugin's default.
const defaultLeaseDuration = 40 * time.Second

// Doctor runs the checklist on s: the node checks on each of nodes (empty:
// every GPU node), then the cluster checks. It fails only on a node name
// that s does not have.
func Doctor(s *Snapshot, nodes []string) (Report, error) {
	var r Report
	targets, err := s.doctorNodes(nodes)
	if err != nil {
		return r, err
	}
	if len(targets) == 0 {
		r.add(Check{Name: "gpu-nodes", Result: Fail,
			Message: "no node has the device plugin's inventory, ready label or hami.io/gpu capacity",
			Fix:     "install the chart (helm install gpuslice charts/gpuslice -n gpuslice-system --create-namespace) and label the GPU nodes so devicePlugin.nodeSelector (default nvidia.com/gpu.present=true) selects them"})
	}
	for _, n := range targets {
		checks := s.nodeChecks
		if s.IsDRANode(n) {
			checks = s.draNodeChecks
		}
		for _, c := range checks(n) {
			c.Node = n.Name
			r.add(c)
		}
	}
	for _, c := range s.clusterChecks() {
		r.add(c)
	}
	return r, nil
}

func (r *Report) add(c Check) {
	r.Checks = append(r.Checks, c)
	switch c.Result {
	case Warn:
		r.Warnings++
	case Fail:
		r.Failures++
	}
}

// doctorNodes returns the named nodes, or every GPU node.
func (s *Snapshot) doctorNodes(names []string) ([]*corev1.Node, error) {
	var out []*corev1.Node
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if (len(names) == 0 && (IsGPUNode(n) || s.IsDRANode(n) || s.pluginPod(n.Name) != nil)) || slices.Contains(names, n.Name) {
			out = append(out, n)
		}
	}
	for _, name := range names {
		if !slices.ContainsFunc(out, func(n *corev1.Node) bool { return n.Name == name }) {
			return nil, fmt.Errorf("node %q: not found", name)
		}
	}
	return out, nil
}

// pluginPod returns the device-plugin pod on node, nil when none.
func (s *Snapshot) pluginPod(node string) *corev1.Pod {
	for i := range s.Pods {
		if p := &s.Pods[i]; p.Spec.NodeName == node && isPluginPod(p) {
			return p
		}
	}
	return nil
}

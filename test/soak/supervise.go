package soak

import (
	"context"
	"fmt"
	"strings"

	"github.com/gpuslice/gpuslice/test/cluster"
)

// gpusliceParts are the processes that are gpuslice's own: a crash of one is a violation. The
// others (Kubernetes' own) are counted as crashes and restarted.
var gpusliceParts = map[string]bool{cluster.ExtenderName: true, cluster.WebhookName: true, "device plugin": true}

// supervise restarts every component that exited on its own, as a real cluster's supervisor
// would (the kubelet restarts static pods, a Deployment or DaemonSet its pods), and records the
// crash with the end of its log: a violation for a gpuslice component, a counted crash for a
// Kubernetes one. The chaos loop calls it between faults, and settle before its checks.
func (s *soak) supervise(ctx context.Context) {
	for _, name := range []string{cluster.APIServerName, cluster.KubeSchedulerName, cluster.ExtenderName, cluster.WebhookName} {
		if p := s.c.Process(name); p != nil && p.Exited() {
			s.crashed(name, p)
			if err := s.c.Restart(ctx, name, true); err != nil {
				s.tally.violate(InvariantRecovered, "restart "+name+" "+p.Log, fmt.Sprintf("restart %s after its crash: %v", name, err))
			}
		}
	}
	for _, n := range s.c.Nodes {
		if n.Kubelet.Exited() {
			s.crashed("kubelet", n.Kubelet)
			if err := n.StartKubelet(ctx); err != nil {
				s.tally.violate(InvariantRecovered, "restart kubelet "+n.Name, fmt.Sprintf("restart the kubelet of %s after its crash: %v", n.Name, err))
			}
		}
		if n.Plugin.Exited() {
			s.crashed("device plugin", n.Plugin)
			err := n.StartPlugin()
			if err == nil {
				err = n.WaitPluginReady(ctx)
			}
			if err != nil {
				s.tally.violate(InvariantRecovered, "restart plugin "+n.Name, fmt.Sprintf("restart the device plugin of %s after its crash: %v", n.Name, err))
			}
		}
	}
}

// crashed records that component's process p exited on its own.
func (s *soak) crashed(component string, p *cluster.Process) {
	tail := p.LogTail(5)
	if gpusliceParts[component] {
		s.tally.violate(InvariantNoCrash, fmt.Sprintf("%s %d", p.Name, p.PID), fmt.Sprintf("%s (pid %d) exited on its own; its log ends:\n%s", p.Name, p.PID, tail))
	}
	last := tail
	if i := strings.LastIndexByte(strings.TrimRight(tail, "\n"), '\n'); i >= 0 {
		last = tail[i+1:]
	}
	if len(last) > 300 {
		last = last[:300]
	}
	s.tally.add(func(r *Report) {
		r.Crashes[p.Name]++
		r.CrashExample[p.Name] = last
	})
}

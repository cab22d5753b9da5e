package soak

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gpuslice/gpuslice/test/cluster"
)

// gpuslicePart reports whether component is one of gpuslice's own processes: a crash of one is
// a violation. The others (Kubernetes' own) are counted as crashes and restarted; a
// kube-scheduler exits by design when it loses its leader Lease.
func (s *soak) gpuslicePart(component string) bool {
	if component == cluster.WebhookName || component == "device plugin" {
		return true
	}
	for _, p := range s.c.Schedulers() {
		if component == p.Extender {
			return true
		}
	}
	return false
}

// controlPlane returns the names of the control-plane processes the soak restarts: the API
// server, the webhook, and both processes of every scheduler pair.
func (s *soak) controlPlane() []string {
	names := []string{cluster.APIServerName, cluster.WebhookName}
	for _, p := range s.c.Schedulers() {
		names = append(names, p.KubeScheduler, p.Extender)
	}
	return names
}

// superviseInterval is how often the supervisor looks for a component that exited on its
// own: a real cluster's supervisor (the kubelet for static pods, a Deployment's controller)
// restarts within seconds, so a crash outside the chaos must not wait for the next fault.
const superviseInterval = time.Second

// parts holds one lock per restartable component: whoever stops and starts a component (a
// chaos fault or the supervisor) holds its lock throughout, so the supervisor never restarts
// a component the chaos loop has stopped on purpose, and the two never start one twice. The
// lock also guards the Node's Kubelet and Plugin fields, which a start replaces.
type parts struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func newParts() *parts { return &parts{locks: map[string]*sync.Mutex{}} }

// lock returns the lock of component key ("kube-scheduler", "kubelet node-a").
func (p *parts) lock(key string) *sync.Mutex {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.locks[key]
	if l == nil {
		l = &sync.Mutex{}
		p.locks[key] = l
	}
	return l
}

// hold runs f with key's lock held.
func (p *parts) hold(key string, f func() error) error {
	l := p.lock(key)
	l.Lock()
	defer l.Unlock()
	return f()
}

// superviseLoop runs supervise every superviseInterval until ctx ends.
func (s *soak) superviseLoop(ctx context.Context) {
	for pause(ctx, superviseInterval) {
		s.superviseNow()
	}
}

// supervise restarts every component that exited on its own, as a real cluster's supervisor
// would (the kubelet restarts static pods, a Deployment or DaemonSet its pods), and records the
// crash with the end of its log: a violation for a gpuslice component, a counted crash for a
// Kubernetes one. A component whose lock another holds (the chaos loop restarting it) is left
// to that holder. The supervisor loop calls it every second during the chaos, and settle
// before its checks.
func (s *soak) supervise(ctx context.Context) {
	for _, name := range s.controlPlane() {
		s.tryHold(name, func() {
			if p := s.c.Process(name); p != nil && p.Exited() {
				s.crashed(name, p)
				if err := s.c.Restart(ctx, name, true); err != nil {
					s.tally.violate(InvariantRecovered, "restart "+name+" "+p.Log, fmt.Sprintf("restart %s after its crash: %v", name, err))
				}
			}
		})
	}
	for _, n := range s.c.Nodes {
		s.tryHold(kubeletPart(n), func() {
			if n.Kubelet.Exited() {
				s.crashed("kubelet", n.Kubelet)
				if err := n.StartKubelet(ctx); err != nil {
					s.tally.violate(InvariantRecovered, "restart kubelet "+n.Name, fmt.Sprintf("restart the kubelet of %s after its crash: %v", n.Name, err))
				}
			}
		})
		s.tryHold(pluginPart(n), func() {
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
		})
	}
}

// tryHold runs f with key's lock held, or skips it when another holds the lock.
func (s *soak) tryHold(key string, f func()) {
	l := s.parts.lock(key)
	if !l.TryLock() {
		return
	}
	defer l.Unlock()
	f()
}

// kubeletPart and pluginPart name the locks of n's kubelet and device plugin.
func kubeletPart(n *cluster.Node) string { return "kubelet " + n.Name }
func pluginPart(n *cluster.Node) string  { return "device plugin " + n.Name }

// crashed records that component's process p exited on its own.
func (s *soak) crashed(component string, p *cluster.Process) {
	tail := p.LogTail(5)
	if s.gpuslicePart(component) {
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

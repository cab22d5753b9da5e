package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/test/cluster"
)

// unlistedXID is an XID the table does not list: a recoverable device fault.
const unlistedXID = 999

// restartTimeout bounds one component's restart, readiness included.
const restartTimeout = 2 * time.Minute

// chaos injects one fault after another until ctx ends: it kills (SIGKILL) or stops (SIGTERM)
// a random component and starts it again, or injects a random XID into a random fake GPU, or
// resets a GPU that an XID left waiting for one. Each restart completes, readiness included,
// before the next fault, also when ctx ends in between, so that the cluster is whole when chaos
// returns; the restart holds the component's lock (parts), so that the supervisor leaves it
// alone. A component that does not come back is a violation.
func (s *soak) chaos(ctx context.Context, rng *rand.Rand) {
	for pause(ctx, between(rng, time.Second, 4*time.Second)) {
		kind, err := s.fault(rng)
		s.tally.add(func(r *Report) { r.Faults[kind]++ })
		if err != nil {
			s.tally.violate(InvariantRecovered, fmt.Sprintf("%s %v", kind, time.Now()), fmt.Sprintf("%s: %v\n%s", kind, err, s.c.LogTails(20)))
		}
	}
}

// superviseNow runs supervise within restartTimeout.
func (s *soak) superviseNow() {
	ctx, cancel := context.WithTimeout(context.Background(), restartTimeout)
	defer cancel()
	s.supervise(ctx)
}

// fault injects one random fault and returns its kind, e.g. "kubelet SIGKILL" or "XID reset
// required".
func (s *soak) fault(rng *rand.Rand) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), restartTimeout)
	defer cancel()
	n := s.c.Nodes[rng.IntN(len(s.c.Nodes))]
	kill := rng.IntN(2) == 0
	signal := "SIGTERM"
	if kill {
		signal = "SIGKILL"
	}
	switch rng.IntN(9) {
	case 0:
		return "kubelet " + signal, s.parts.hold(kubeletPart(n), func() error { return s.restartKubelet(ctx, rng, n, kill) })
	case 1:
		return "device plugin " + signal, s.parts.hold(pluginPart(n), func() error { return s.restartPlugin(ctx, rng, n, kill) })
	case 2:
		return "extender " + signal, s.restart(ctx, cluster.ExtenderName, kill)
	case 3:
		return "kube-scheduler " + signal, s.restart(ctx, cluster.KubeSchedulerName, kill)
	case 4:
		return "webhook " + signal, s.restart(ctx, cluster.WebhookName, kill)
	case 5:
		return "kube-apiserver " + signal, s.restart(ctx, cluster.APIServerName, kill)
	case 6:
		if node, gpu, ok := s.takeReset(rng); ok {
			return "GPU reset", s.inject(node, nvidia.FakeFault{GPU: gpu, Reset: true})
		}
		fallthrough
	default:
		return s.injectXID(rng, n)
	}
}

// restart restarts the cluster component name, its lock held.
func (s *soak) restart(ctx context.Context, name string, kill bool) error {
	return s.parts.hold(name, func() error { return s.c.Restart(ctx, name, kill) })
}

// restartKubelet ends n's kubelet, waits a moment, and starts it again.
func (s *soak) restartKubelet(ctx context.Context, rng *rand.Rand, n *cluster.Node, kill bool) error {
	end := n.StopKubelet
	if kill {
		end = n.KillKubelet
	}
	if err := end(); err != nil {
		return err
	}
	pause(ctx, between(rng, 0, 2*time.Second))
	return n.StartKubelet(ctx)
}

// restartPlugin ends n's device plugin, waits a moment, starts it again and waits until it is
// registered. The fake GPUs keep their recovery actions in the faults folder and the plugin its
// fault records in its state folder, so n's GPUs that waited for a reset still wait for it after
// the restart. When all of them do, one is reset: a plugin with no healthy GPU has nothing
// allocatable, which WaitPluginReady waits for.
func (s *soak) restartPlugin(ctx context.Context, rng *rand.Rand, n *cluster.Node, kill bool) error {
	end := n.StopPlugin
	if kill {
		end = n.KillPlugin
	}
	if err := end(); err != nil {
		return err
	}
	pause(ctx, between(rng, 0, 2*time.Second))
	if err := n.StartPlugin(); err != nil {
		return err
	}
	gpus, err := nvidia.ParseFakeSpec(n.FakeGPUs)
	if err != nil {
		return err
	}
	s.mu.Lock()
	waiting := s.needsReset[n.Name]
	reset := -1
	if len(waiting) == len(gpus) {
		for gpu := range waiting {
			reset = gpu
			break
		}
		delete(waiting, reset)
	}
	s.mu.Unlock()
	if reset >= 0 {
		if err := s.inject(n, nvidia.FakeFault{GPU: reset, Reset: true}); err != nil {
			return err
		}
	}
	return n.WaitPluginReady(ctx)
}

// injectXID injects a random XID of the table, or one it does not list, into a random GPU of n,
// and returns the fault's kind by the XID's class.
func (s *soak) injectXID(rng *rand.Rand, n *cluster.Node) (string, error) {
	known := nvidia.KnownXIDs()
	xid := uint64(unlistedXID)
	if rng.IntN(len(known)+1) < len(known) {
		xid = known[rng.IntN(len(known))]
	}
	gpus, err := nvidia.ParseFakeSpec(n.FakeGPUs)
	if err != nil {
		return "XID", err
	}
	gpu := rng.IntN(len(gpus))
	class := nvidia.ClassifyXID(xid)
	if class.Kind == nvidia.ResetRequired {
		s.mu.Lock()
		if s.needsReset[n.Name] == nil {
			s.needsReset[n.Name] = map[int]bool{}
		}
		s.needsReset[n.Name][gpu] = true
		s.mu.Unlock()
	}
	return "XID " + class.Kind.String(), s.inject(n, nvidia.FakeFault{GPU: gpu, XID: xid})
}

// takeReset picks a GPU that waits for a reset, forgets it and returns it; false when none waits.
func (s *soak) takeReset(rng *rand.Rand) (*cluster.Node, int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.c.Nodes {
		for gpu := range s.needsReset[n.Name] {
			if rng.IntN(2) == 0 {
				continue
			}
			delete(s.needsReset[n.Name], gpu)
			return n, gpu, true
		}
	}
	return nil, 0, false
}

// inject writes fault into n's faults folder. The plugin applies it within a scan, or once it
// is back if it is down.
func (s *soak) inject(n *cluster.Node, fault nvidia.FakeFault) error {
	if _, err := nvidia.WriteFakeFault(n.FaultsDir(), fault); err != nil {
		return errors.Join(fmt.Errorf("node %s: %v", n.Name, fault), err)
	}
	return nil
}

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
// resets a GPU that an XID left waiting for one, or makes the API server slow to write for the
// extenders (writeLatency), or ends the leading scheduler pair (handOver). Each restart completes, readiness included,
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
	pairs := s.c.Schedulers()
	pair := pairs[rng.IntN(len(pairs))]
	switch rng.IntN(11) {
	case 0:
		kind := "kubelet " + signal
		s.tally.nodeFault(n.Name, kind, time.Now())
		return kind, s.parts.hold(kubeletPart(n), func() error { return s.restartKubelet(ctx, rng, n, kill) })
	case 1:
		kind := "device plugin " + signal
		s.tally.nodeFault(n.Name, kind, time.Now())
		return kind, s.parts.hold(pluginPart(n), func() error { return s.restartPlugin(ctx, rng, n, kill) })
	case 2:
		return "extender " + signal, s.restart(ctx, pair.Extender, kill)
	case 3:
		return "kube-scheduler " + signal, s.restart(ctx, pair.KubeScheduler, kill)
	case 4:
		return "webhook " + signal, s.restart(ctx, cluster.WebhookName, kill)
	case 5:
		return "kube-apiserver " + signal, s.restart(ctx, cluster.APIServerName, kill)
	case 6:
		if node, gpu, ok := s.takeReset(rng); ok {
			return "GPU reset", s.inject(node, nvidia.FakeFault{GPU: gpu, Reset: true})
		}
		return s.injectXID(rng, n)
	case 7:
		return "API write latency", s.writeLatency(ctx, rng)
	case 8:
		return "leader hand-over " + signal, s.handOver(ctx, kill)
	default:
		return s.injectXID(rng, n)
	}
}

// Bounds of the writeLatency fault: each extender write is held for writeDelayMin to
// writeDelayMax, beyond the extender's 5 s bind timeout about half the time, so that a Bind
// times out and its Binding commits after the extender gave up on it; the delay lasts
// writeWindowMin to writeWindowMax.
const (
	writeDelayMin, writeDelayMax   = 2 * time.Second, 8 * time.Second
	writeWindowMin, writeWindowMax = 5 * time.Second, 15 * time.Second
)

// writeLatency holds every write of the extenders (binds, retry annotations, conditions,
// events) at the cluster's API proxy for a random delay during a random window, as an API
// server or etcd that stalls after accepting a request: a write the extender gave up on still
// commits, late.
func (s *soak) writeLatency(ctx context.Context, rng *rand.Rand) error {
	proxy, err := s.c.APIProxy()
	if err != nil {
		return err
	}
	return s.parts.hold("api proxy", func() error {
		proxy.SetWriteDelay(between(rng, writeDelayMin, writeDelayMax))
		defer proxy.SetWriteDelay(0)
		pause(ctx, between(rng, writeWindowMin, writeWindowMax))
		return nil
	})
}

// leaderPoll is how often handOver reads the leader Lease; handOverTimeout bounds its wait for
// a new leader (kube-scheduler's Lease of soakElection expires within seconds).
const (
	leaderPoll      = 50 * time.Millisecond
	handOverTimeout = time.Minute
)

// handOver ends both processes of the scheduler pair whose kube-scheduler leads (killed or
// stopped, as a node lost or a rollout would), measures how long until another pair's
// kube-scheduler holds the leader Lease (Report.HandOvers), and starts the pair again, as the
// Deployment's new pod would. No pair leading within restartTimeout is an error.
func (s *soak) handOver(ctx context.Context, kill bool) error {
	pairs := s.c.Schedulers()
	if len(pairs) < 2 {
		return errors.New("leader hand-over: the cluster runs one scheduler pair")
	}
	before, cancel := context.WithTimeout(ctx, handOverTimeout)
	leader, err := s.waitLeader(before, -1)
	cancel()
	if err != nil {
		return fmt.Errorf("leader hand-over: before it: %w", err)
	}
	p := pairs[leader]
	return s.parts.hold(p.KubeScheduler, func() error {
		return s.parts.hold(p.Extender, func() error {
			ended := time.Now()
			for _, name := range []string{p.KubeScheduler, p.Extender} {
				if proc := s.c.Process(name); proc != nil && proc.Exited() {
					continue // a kube-scheduler that lost its Lease exits on its own
				}
				if err := s.c.End(name, kill); err != nil {
					return err
				}
			}
			waitCtx, cancel := context.WithTimeout(ctx, handOverTimeout)
			_, waitErr := s.waitLeader(waitCtx, leader)
			cancel()
			took := time.Since(ended)
			s.tally.add(func(r *Report) {
				if waitErr != nil {
					r.HandOverFailed++
					return
				}
				r.HandOvers = append(r.HandOvers, took)
			})
			var errs []error
			if waitErr != nil {
				errs = append(errs, fmt.Errorf("leader hand-over from pair %d: %w", leader, waitErr))
			}
			startCtx, cancel := context.WithTimeout(context.Background(), restartTimeout)
			defer cancel()
			for _, name := range []string{p.Extender, p.KubeScheduler} {
				if err := s.c.StartAgain(startCtx, name); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		})
	})
}

// waitLeader waits until a scheduler pair other than not (-1: any) leads and returns its index.
func (s *soak) waitLeader(ctx context.Context, not int) (int, error) {
	last := "no pair"
	for {
		leader, err := s.c.SchedulerLeader(ctx)
		switch {
		case err != nil:
			last = err.Error()
		case leader >= 0 && leader != not:
			return leader, nil
		case leader >= 0:
			last = fmt.Sprintf("pair %d still", leader)
		}
		if !pause(ctx, leaderPoll) {
			return -1, fmt.Errorf("no new scheduler leader: %s leads: %w", last, ctx.Err())
		}
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

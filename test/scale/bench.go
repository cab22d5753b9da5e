package scale

import (
	"context"
	"errors"
	"time"
)

// Phase names of Bench.
const (
	PhasePlain = "plain"
	PhaseGPU   = "gpu"
	// PhaseBackground labels BenchConfig.Background's pods.
	PhaseBackground = "background"
)

// BenchConfig is one Bench run.
type BenchConfig struct {
	// Harness is the cluster to start; its Nodes are the hollow nodes.
	Harness Config
	// Pods is N, the pods of each phase; required.
	Pods int
	// Seed draws the GPU pods' slice sizes from SliceMix.
	Seed uint64
	// PhaseTimeout bounds each phase (Phase.Timeout).
	PhaseTimeout time.Duration
	// Background is how many plain pods are created already bound (spec.nodeName set, round
	// robin over the hollow nodes) before the phases and kept through them, so that both
	// schedulers' caches hold a cluster's worth of pods when memory is measured; 0 creates
	// none.
	Background int
}

// BenchResult is what Bench measured on one cluster.
type BenchResult struct {
	// Nodes and GPUs count the hollow nodes and their GPUs; Models says the GPU models.
	Nodes, GPUs int
	Models      string
	// Pods is N; Background is BenchConfig.Background.
	Pods, Background int
	// Plain is N plain pods through the default profile; GPU is N GPU pods through the gpuslice
	// profile, in a cluster emptied of the plain pods again.
	Plain, GPU PhaseResult
	// Check is the correctness check of the GPU pods bound.
	Check CheckResult
	// HeartbeatRenewals and HeartbeatFailures count the Lease renewals the harness sent.
	HeartbeatRenewals, HeartbeatFailures int64
	// HeartbeatError is the last renewal error, if any.
	HeartbeatError string
	// Profile is the chart's scheduler configuration kube-scheduler ran.
	Profile ChartProfile
	// Wake and WakeHeartbeat are the targeted-retry measurements (Harness.Wake and
	// WakeHeartbeat), run once the GPU pods are deleted again; nil when the cluster has fewer
	// than four nodes.
	Wake, WakeHeartbeat *WakeResult
}

// Ratio is the GPU phase's pods/s over the plain phase's.
func (r BenchResult) Ratio() float64 {
	if p := r.Plain.PodsPerSecond(); p > 0 {
		return r.GPU.PodsPerSecond() / p
	}
	return 0
}

// Bench starts a harness, runs N plain pods, deletes them, runs N GPU pods, checks the GPU pods'
// allocations and stops the harness. Only a harness error is returned; a failed check is in
// the result.
func Bench(ctx context.Context, cfg BenchConfig) (res BenchResult, err error) {
	if cfg.Pods <= 0 {
		return res, errors.New("bench config: Pods must be above 0")
	}
	res = BenchResult{Nodes: len(cfg.Harness.Nodes), GPUs: gpuCount(cfg.Harness.Nodes), Models: modelMix(cfg.Harness.Nodes), Pods: cfg.Pods, Background: cfg.Background}
	h, err := Start(ctx, cfg.Harness)
	if err != nil {
		return res, err
	}
	defer func() {
		if stopErr := h.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
	}()
	res.Profile = h.Profile
	if cfg.Background > 0 {
		if err := h.CreateBound(ctx, PhaseBackground, PlainPods(PhaseBackground, cfg.Background)); err != nil {
			return res, err
		}
	}
	if res.Plain, err = h.RunPhase(ctx, Phase{Name: PhasePlain, Pods: PlainPods(PhasePlain, cfg.Pods), Timeout: cfg.PhaseTimeout}); err != nil {
		return res, err
	}
	if err := h.DeletePhase(ctx, PhasePlain); err != nil {
		return res, err
	}
	if res.GPU, err = h.RunPhase(ctx, Phase{Name: PhaseGPU, Pods: GPUPods(PhaseGPU, cfg.Pods, SliceMix, cfg.Seed), Timeout: cfg.PhaseTimeout}); err != nil {
		return res, err
	}
	res.Check = h.Check(PhaseGPU)
	res.HeartbeatRenewals, res.HeartbeatFailures = h.heartbeats.renewals.Load(), h.heartbeats.failures.Load()
	res.HeartbeatError = h.heartbeats.lastError()
	if res.Check.Pods != res.GPU.Bound {
		// Binds in flight at the deadline may land after it; say so rather than fail.
		h.cfg.Logf("checked %d bound GPU pods; %d were bound at the phase's end", res.Check.Pods, res.GPU.Bound)
	}
	if nodes := cfg.Harness.Nodes; len(nodes) >= 4 {
		if err := h.DeletePhase(ctx, PhaseGPU); err != nil {
			return res, err
		}
		w, err := h.Wake(ctx, nodes[0].Name, nodes[1].Name, len(nodes[0].Inventory.GPUs), wakeWaiters)
		if err != nil {
			return res, err
		}
		res.Wake = &w
		hb, err := h.WakeHeartbeat(ctx, nodes[2].Name, nodes[3].Name, wakeWaiters)
		if err != nil {
			return res, err
		}
		res.WakeHeartbeat = &hb
	}
	return res, nil
}

// wakeWaiters is how many pods Bench makes wait for room on one full node.
const wakeWaiters = 6

// PodsFor is the default N for a cluster of nodes hollow nodes: 2 per node up to 1,000 nodes
// (2,000 at 1,000 nodes), then 1 per node, so that 5,000 nodes get 5,000 pods per phase.
func PodsFor(nodes int) int {
	if nodes <= 1000 {
		return 2 * nodes
	}
	return max(2000, nodes)
}

package vgpu_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
)

// TestSummaryFitEqualsFit fills random nodes with random pods and checks,
// before every placement, that NodeSummary.Fit gives exactly what Fit
// gives — placement, every figure to the bit, error — for each policy,
// with the summary's own workload, another workload, none, and host
// resources known or not; and that no placement scores above the node's
// ScoreBound or its ScoreBoundByGPU, which is no higher than ScoreBound,
// and that neither says the node cannot reach its own score.
func TestSummaryFitEqualsFit(t *testing.T) {
	t.Parallel()
	// hosted asks for CPU and memory, so that hosts short of them bound
	// what its classes can use.
	hosted := vgpu.NewWorkload(
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Host: vgpu.HostResources{CPUMilli: 6000, MemoryMiB: 8192}, Weight: 2},
		vgpu.WorkloadClass{GPUs: 2, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Host: vgpu.HostResources{CPUMilli: 4000}, Weight: 1},
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 30, Host: vgpu.HostResources{CPUMilli: 3000, MemoryMiB: 4096}, Weight: 1},
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 50, CoresPercent: 50, Host: vgpu.HostResources{CPUMilli: 1000}, Weight: 1},
		vgpu.WorkloadClass{Host: vgpu.HostResources{CPUMilli: 2000}, Weight: 1},
	)
	// filled has a supply, so it counts expected fills (fill.go), with
	// slices pinned to a model so that its fill tables differ by model,
	// and a pod without GPUs for the hosts' λ.
	filled := hosted.Snapshot(0)
	filled.AddClass(vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 45, Models: []string{"T4"}, Host: vgpu.HostResources{CPUMilli: 2000, MemoryMiB: 2048}, Weight: 2})
	filled.AddClass(vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 20, CoresPercent: 20, Weight: 1})
	filled.Add(vgpu.PodDemand{Host: vgpu.HostResources{CPUMilli: 3000, MemoryMiB: 4096}})
	filled.SetSupply(map[string]int{"NVIDIA A100-SXM4-80GB": 8, "Tesla T4": 4, "NVIDIA H100": 8})
	workloads := []*vgpu.Workload{vgpu.DefaultWorkload(), nil, hosted, filled}
	other := vgpu.DefaultWorkload()
	for _, seed := range propertySeeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			compared, fitted, rejected, bounded, tight, tightRaw := 0, 0, 0, 0, 0, 0
			for round := range 30 {
				node := randomNode(rng)
				usage := &vgpu.NodeUsage{}
				var host *vgpu.HostResources
				if rng.IntN(3) == 0 {
					host = &vgpu.HostResources{CPUMilli: int64(rng.IntN(16000)), MemoryMiB: int64(rng.IntN(65536))}
				}
				w := workloads[rng.IntN(len(workloads))]
				for range 20 {
					state := vgpu.NodeState{Inventory: node, Usage: usage, HostFree: host}
					sum := vgpu.Summarize(state, w)
					d := randomDemand(rng, node)
					if rng.IntN(2) == 0 {
						d = oneSliceDemand(rng)
					}
					if rng.IntN(3) == 0 {
						d.Host = vgpu.HostResources{CPUMilli: int64(rng.IntN(8000)), MemoryMiB: int64(rng.IntN(32768))}
					}
					if r, ok := sum.Reject(d); ok {
						_, err := vgpu.Fit(d, state, vgpu.FitOptions{})
						var fe *vgpu.FitError
						if !errors.As(err, &fe) || fe.Reason != r || fe.Container != 0 {
							t.Fatalf("round %d: Reject says %s, Fit says %v", round, r, err)
						}
						rejected++
					}
					var placed vgpu.Placement
					// Node and GPU policies: fragmentation on the node, and
					// each policy alone, so that every path of NodeSummary.Fit
					// meets host resources known and not.
					policies := [][2]vgpu.Policy{{vgpu.PolicyFragmentation, vgpu.PolicyBinpack}, {vgpu.PolicyBinpack, vgpu.PolicyBinpack}, {vgpu.PolicySpread, vgpu.PolicySpread}, {vgpu.PolicyFragmentation, vgpu.PolicyFragmentation},
						{vgpu.PolicyFragmentation, vgpu.PolicyFirstFit}, {vgpu.PolicyBinpack, vgpu.PolicyFirstFit}}
					policy := policies[rng.IntN(len(policies))]
					for _, ow := range []*vgpu.Workload{w, other} {
						for _, variant := range []int{0, 1, 2, 3} {
							unscored, reasonOnly := variant&1 != 0, variant&2 != 0
							opts := vgpu.FitOptions{NodePolicy: policy[0], GPUPolicy: policy[1], Workload: ow, Unscored: unscored, ReasonOnly: reasonOnly}
							want, wantErr := vgpu.Fit(d, state, opts)
							got, gotErr := sum.Fit(d, opts)
							compared++
							if diff := cmp.Diff(want, got); diff != "" || fmt.Sprint(wantErr) != fmt.Sprint(gotErr) {
								t.Fatalf("round %d: summary differs from Fit (-Fit +summary):\n%s\nerrors %v / %v", round, diff, wantErr, gotErr)
							}
							// NoAllocation: the same but for the allocation's containers.
							opts.NoAllocation = true
							bare, bareErr := sum.Fit(d, opts)
							want.Allocation.Containers = nil
							if diff := cmp.Diff(want, bare); diff != "" || fmt.Sprint(wantErr) != fmt.Sprint(bareErr) {
								t.Fatalf("round %d: NoAllocation differs (-Fit +NoAllocation):\n%s", round, diff)
							}
							if wantErr == nil && !unscored {
								// No placement scores above the node's bound.
								sc, b := vgpu.Score(got), sum.ScoreBound(d, opts)
								if sc.Value > b.Value || sc.Raw > b.Raw || sc.Tie > b.Tie {
									t.Fatalf("round %d: placement scores %+v under %v, above the bound %+v", round, sc, policy, b)
								} else if b.Value < vgpu.MaxScore && b.Value-sc.Value <= 1 {
									tight++
								}
								byGPU := sum.ScoreBoundByGPU(d, opts, b)
								if sc.Value > byGPU.Value || sc.Raw > byGPU.Raw || sc.Tie > byGPU.Tie {
									t.Fatalf("round %d: placement scores %+v under %v, above the bound by GPU %+v", round, sc, policy, byGPU)
								} else if byGPU.Value > b.Value || byGPU.Raw > b.Raw || byGPU.Tie > b.Tie {
									t.Fatalf("round %d: the bound by GPU %+v is above the node's %+v", round, byGPU, b)
								} else if byGPU.CannotReach(sc) || b.CannotReach(sc) {
									t.Fatalf("round %d: the bounds %+v and %+v say the node cannot reach its own score %+v", round, b, byGPU, sc)
								}
								if !math.IsInf(byGPU.Raw, 1) && byGPU.Raw-sc.Raw <= 1e-3 {
									tightRaw++
								}
								bounded++
								if ow == w {
									placed = got
								}
							}
						}
					}
					if placed.Allocation.Node != "" && len(placed.Allocation.Containers) > 0 {
						fitted++
						usage.Add(placed.Allocation, d.Request)
					}
				}
			}
			if fitted == 0 {
				t.Errorf("no pod fitted in %d comparisons: the generator is off", compared)
			}
			if tight == 0 {
				t.Errorf("no score came within 1 of a bound below %d: the bound check is idle", vgpu.MaxScore)
			}
			if tightRaw == 0 {
				t.Errorf("no Raw came within 0.001 of its bound: the bound check is idle")
			}
			t.Logf("%d comparisons, %d fitted, %d rejected from the summary alone, %d scores within their node's bound (%d of them within 1, %d Raws within 0.001)", compared, fitted, rejected, bounded, tight, tightRaw)
		})
	}
}

// TestSummaryFigures checks the summary's largest free slice on a known node, through Reject.
func TestSummaryFigures(t *testing.T) {
	node := vgpu.NodeInventory{Node: "n1", SplitCount: 4, MemoryScaling: 1, GPUs: []vgpu.GPU{
		{UUID: "GPU-0", Index: 0, TotalMemoryMiB: 16384, SchedulableMemoryMiB: 16384, CoresPercent: 100, Health: vgpu.Healthy},
		{UUID: "GPU-1", Index: 1, TotalMemoryMiB: 16384, SchedulableMemoryMiB: 16384, CoresPercent: 100, Health: vgpu.Healthy},
		{UUID: "GPU-2", Index: 2, TotalMemoryMiB: 81920, SchedulableMemoryMiB: 81920, CoresPercent: 100, Health: vgpu.Unhealthy},
	}}
	usage := &vgpu.NodeUsage{}
	usage.Add(vgpu.PodAllocation{Node: "n1", Containers: []vgpu.ContainerAllocation{{Name: "a", GPUs: []vgpu.GPUSlice{{UUID: "GPU-0", MemoryMiB: 4096}}}}}, vgpu.PodRequest{})
	s := vgpu.Summarize(vgpu.NodeState{Inventory: node, Usage: usage}, nil)
	// The largest free slice is GPU-1's 16384 MiB; the unhealthy GPU-2
	// does not count.
	slice := func(mib int64) vgpu.PodDemand {
		return vgpu.PodDemand{Request: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "main", GPUs: 1, MemoryMiB: mib}}}}
	}
	if r, ok := s.Reject(slice(16384)); ok {
		t.Errorf("Reject(16384 MiB) = %s: GPU-1 has it free", r)
	}
	if r, ok := s.Reject(slice(16385)); !ok || r != vgpu.ReasonInsufficientMemory {
		t.Errorf("Reject(16385 MiB) = %q, %t; want %s", r, ok, vgpu.ReasonInsufficientMemory)
	}
}

// TestSummaryReject fills random nodes with one-slice pods and checks that
// whenever Reject turns a one-slice pod away, Fit does so for the same
// reason, and that Reject decides a good share of the pods that do not fit.
func TestSummaryReject(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(9, 9))
	decided, unfit := 0, 0
	for round := range 200 {
		node := randomNode(rng)
		usage := &vgpu.NodeUsage{}
		for range 40 {
			d := vgpu.PodDemand{Request: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{
				Name: "main", GPUs: 1, MemoryMiB: int64(1024 * (1 + rng.IntN(24))), CoresPercent: []int{0, 10, 30}[rng.IntN(3)],
			}}}}
			state := vgpu.NodeState{Inventory: node, Usage: usage}
			p, err := vgpu.Fit(d, state, vgpu.FitOptions{})
			r, ok := vgpu.Summarize(state, nil).Reject(d)
			var fe *vgpu.FitError
			switch {
			case ok && (!errors.As(err, &fe) || fe.Reason != r):
				t.Fatalf("round %d: Reject says %s, Fit says %v", round, r, err)
			case err != nil:
				unfit++
				if ok {
					decided++
				}
			default:
				usage.Add(p.Allocation, d.Request)
			}
		}
	}
	if unfit == 0 || decided < unfit/2 {
		t.Errorf("Reject decided %d of %d pods that do not fit; want at least half", decided, unfit)
	}
}

// oneSliceDemand is a random pod of one container asking for one slice of
// one GPU without filters: the pods NodeSummary.Fit answers from its cells.
func oneSliceDemand(rng *rand.Rand) vgpu.PodDemand {
	c := vgpu.ContainerRequest{Name: "main", GPUs: 1, CoresPercent: []int{0, 10, 25, 50}[rng.IntN(4)]}
	if rng.IntN(3) == 0 {
		c.MemoryPercent = 1 + rng.IntN(100)
	} else {
		c.MemoryMiB = int64(256 * (1 + rng.IntN(40)))
	}
	var cons vgpu.Constraints
	cons.GPUPolicy = []vgpu.Policy{"", vgpu.PolicyBinpack, vgpu.PolicySpread, vgpu.PolicyFragmentation}[rng.IntN(4)]
	cons.NodePolicy = []vgpu.Policy{"", vgpu.PolicyBinpack, vgpu.PolicySpread, vgpu.PolicyFragmentation}[rng.IntN(4)]
	return vgpu.PodDemand{Request: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{c}}, Constraints: cons}
}

// TestScoreBoundMultiGPUShapeOutOfReach checks the fragmentation bound on
// a node with fewer GPUs than a shape of the workload needs: that shape
// uses none of the node's free capacity, so a slice lowers the node's
// fragmentation as if the shape were not in the workload, and the bound
// must not count it as able to use the GPU.
func TestScoreBoundMultiGPUShapeOutOfReach(t *testing.T) {
	w := vgpu.NewWorkload(
		vgpu.WorkloadClass{GPUs: 2, MemoryPercent: 10, Weight: 1},
		vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 10, Weight: 1},
	)
	node := vgpu.NodeInventory{Node: "n1", SplitCount: 2, MemoryScaling: 1, GPUs: []vgpu.GPU{
		{UUID: "GPU-0", Index: 0, Model: "Tesla T4", TotalMemoryMiB: 16384, SchedulableMemoryMiB: 16384, CoresPercent: 100, Health: vgpu.Healthy},
		{UUID: "GPU-1", Index: 1, Model: "Tesla T4", TotalMemoryMiB: 16384, SchedulableMemoryMiB: 16384, CoresPercent: 100, Health: vgpu.Healthy},
	}}
	// GPU-1's two slots are taken, so the two-GPU shape can use one GPU
	// of the node: none of its free capacity.
	usage := &vgpu.NodeUsage{}
	for _, name := range []string{"a", "b"} {
		usage.Add(vgpu.PodAllocation{Node: "n1", Containers: []vgpu.ContainerAllocation{{Name: name, GPUs: []vgpu.GPUSlice{{UUID: "GPU-1", MemoryMiB: 1024}}}}}, vgpu.PodRequest{})
	}
	sum := vgpu.Summarize(vgpu.NodeState{Inventory: node, Usage: usage}, w)
	pod := vgpu.PodDemand{Request: vgpu.PodRequest{Containers: []vgpu.ContainerRequest{{Name: "main", GPUs: 1, MemoryPercent: 10}}}}
	opts := vgpu.FitOptions{NodePolicy: vgpu.PolicyFragmentation, GPUPolicy: vgpu.PolicyFragmentation, Workload: w}
	p, err := sum.Fit(pod, opts)
	if err != nil {
		t.Fatal(err)
	}
	sc, b := vgpu.Score(p), sum.ScoreBound(pod, opts)
	if sc.Raw <= 0 {
		t.Fatalf("the slice lowers fragmentation by %v; the case needs it lowered", sc.Raw)
	}
	if sc.Value > b.Value || sc.Raw > b.Raw {
		t.Errorf("placement scores %+v, above the bound %+v", sc, b)
	}
}

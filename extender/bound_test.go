package extender

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

// TestFilterBestEqualsFullScan checks that Filter, which fits a node only
// while its score bound can reach the best tier found (cluster.State.JudgeBest),
// passes exactly the nodes that fitting every node passes, and, when no
// node passes, turns every node away with the same message: for each
// policy, on uneven nodes holding slices by MiB or by percent (whose
// workload counts expected fills), for new pod shapes of one slice (by MiB
// or by percent, with and without host requests) and of two GPUs, each
// reserved on its best node afterwards as a bind would. It also checks
// that the bounds spared most nodes a fit under binpack and spread, and a
// fifth under fragmentation.
func TestFilterBestEqualsFullScan(t *testing.T) {
	t.Parallel()
	for _, policy := range vgpu.Policies() {
		for _, set := range []struct {
			suffix string
			shapes []benchSlice
		}{{"", benchSlices}, {"-percent", benchPercentSlices}} {
			t.Run(string(policy)+set.suffix, func(t *testing.T) {
				t.Parallel()
				testFilterBestEqualsFullScan(t, policy, set.shapes)
			})
		}
	}
}

// testFilterBestEqualsFullScan is TestFilterBestEqualsFullScan on a
// cluster of one policy holding slices of shapes.
func testFilterBestEqualsFullScan(t *testing.T, policy vgpu.Policy, shapes []benchSlice) {
	s, names := benchSchedulerOf(t, 300, 2700, policy, shapes)
	rng := rand.New(rand.NewPCG(11, uint64(len(policy))))
	spared, undecided, none := 0, 0, 0
	for i := range 120 {
		pod := boundTestPod(rng, fmt.Sprintf("p-%03d", i))
		d, err := cluster.DemandOf(pod)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Filter(t.Context(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
		if err != nil {
			t.Fatal(err)
		}
		// What this Filter left unfitted has no verdict remembered, or
		// only a bound.
		for _, name := range names {
			if _, ok := s.state.Summary(name).Reject(d.Pod); ok {
				continue
			}
			undecided++
			if v, ok := s.state.Remembered(name, &d); !ok || v.Bounded {
				spared++
			}
		}
		want := fullScanPassed(s, names, &d)
		if diff := cmp.Diff(want, *got.NodeNames); diff != "" {
			t.Fatalf("pod %d: Filter passed other nodes than a full scan (-full +Filter):\n%s", i, diff)
		}
		if len(want) == 0 {
			none++
			// Every node judged, as FilterResultFeasible judges them.
			s.cfg.FilterResult = FilterResultFeasible
			all, err := s.Filter(t.Context(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
			s.cfg.FilterResult = FilterResultBest
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(all, got); diff != "" {
				t.Fatalf("pod %d fits nowhere, but Filter's reasons differ from a full scan's (-full +Filter):\n%s", i, diff)
			}
			continue
		}
		d.ForBind = true
		if _, err := s.reserve(want[0], &d); err != nil {
			t.Fatalf("pod %d: reserve on %s: %v", i, want[0], err)
		}
	}
	t.Logf("%s: %d of %d nodes left undecided by the screen were not fitted; %d pods fitted nowhere", policy, spared, undecided, none)
	// Under fragmentation many nodes tie at the best Value, and only
	// their Raw bounds spare them.
	want := undecided / 2
	if policy == vgpu.PolicyFragmentation {
		want = undecided / 5
	}
	if spared < want {
		t.Errorf("the bounds spared %d of %d fits under %s; want %d or more", spared, undecided, policy, want)
	}
	if none == 0 {
		t.Errorf("every pod fitted somewhere: the no-fit path went untested")
	}
}

// boundTestPod is a random new pod shape: mostly one slice, by MiB or by
// percent, with host requests or without; now and then two GPUs or more
// memory than any GPU has.
func boundTestPod(rng *rand.Rand, name string) *corev1.Pod {
	b := vgputest.Pod(name).Container("main")
	switch rng.IntN(8) {
	case 0:
		b.GPU(2).MemoryMiB(int64(1024 * (1 + rng.IntN(16))))
	case 1:
		b.GPU(1).MemoryMiB(90000 + int64(rng.IntN(1000))) // no GPU has as much
	case 2, 3:
		b.GPU(1).MemoryPercent(1 + rng.IntN(100))
	default:
		b.GPU(1).MemoryMiB(int64(256 + rng.IntN(50000)))
	}
	if cores := []int{0, 5, 20, 50}[rng.IntN(4)]; cores > 0 {
		b.Cores(cores)
	}
	if rng.IntN(2) == 0 {
		b.Request(corev1.ResourceCPU, fmt.Sprint(1+rng.IntN(8))).Request(corev1.ResourceMemory, fmt.Sprintf("%dGi", 1+rng.IntN(64)))
	}
	pod := b.Obj()
	pod.UID = types.UID("uid-" + name)
	return pod
}

// fullScanPassed is the nodes of names where d fits with the best score,
// from a verdict for every node, in the order of names.
func fullScanPassed(s *Scheduler, names []string, d *cluster.Demand) []string {
	verdicts := make([]cluster.Verdict, len(names))
	s.state.JudgeAll(names, d, func(i int, v cluster.Verdict) { verdicts[i] = v })
	best := bestScore(verdicts)
	passed := []string{}
	for i, v := range verdicts {
		if v.Fits && v.Score.Compare(*best) >= 0 {
			passed = append(passed, names[i])
		}
	}
	return slices.Clip(passed)
}

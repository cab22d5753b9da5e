package vgpu_test

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestScore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		p    vgpu.Placement
		want vgpu.NodeScore
	}{{
		name: "binpack prefers fuller nodes",
		p:    vgpu.Placement{NodePolicy: vgpu.PolicyBinpack, HealthyGPUs: 4, UsedAfter: 3},
		want: vgpu.NodeScore{Value: 75, Raw: 0.75},
	}, {
		name: "spread prefers emptier nodes",
		p:    vgpu.Placement{NodePolicy: vgpu.PolicySpread, HealthyGPUs: 4, UsedAfter: 1},
		want: vgpu.NodeScore{Value: 75, Raw: 0.75},
	}, {
		name: "fragmentation unchanged scores 50",
		p:    vgpu.Placement{NodePolicy: vgpu.PolicyFragmentation, HealthyGPUs: 2, FragmentationBefore: 0.5, FragmentationAfter: 0.5},
		want: vgpu.NodeScore{Value: 50, Raw: 0},
	}, {
		name: "fragmentation filled scores above 50",
		p:    vgpu.Placement{NodePolicy: vgpu.PolicyFragmentation, HealthyGPUs: 2, FragmentationBefore: 1, FragmentationAfter: 0.2},
		want: vgpu.NodeScore{Value: 70, Raw: 0.8},
	}, {
		name: "fragmentation ties break toward the fuller node",
		p:    vgpu.Placement{NodePolicy: vgpu.PolicyFragmentation, HealthyGPUs: 4, UsedAfter: 3, FragmentationBefore: 0.5, FragmentationAfter: 0.5},
		want: vgpu.NodeScore{Value: 50, Raw: 0, Tie: 0.75},
	}, {
		name: "fragmentation clamps at 0",
		p:    vgpu.Placement{NodePolicy: vgpu.PolicyFragmentation, HealthyGPUs: 8, FragmentationAfter: 3},
		want: vgpu.NodeScore{Value: 0, Raw: -3},
	}, {
		name: "no healthy GPU",
		p:    vgpu.Placement{NodePolicy: vgpu.PolicyBinpack},
		want: vgpu.NodeScore{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := vgpu.Score(tt.p)
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); diff != "" {
				t.Errorf("Score() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestScorePolicies checks that the node policy, global or per pod, ranks
// a half-used node and an empty one as it should.
func TestScorePolicies(t *testing.T) {
	t.Parallel()
	node := vgputest.Node("n1").GPU("GPU-0", 16384).GPU("GPU-1", 16384).Obj()
	half := vgputest.Usage(vgputest.Allocation("n1").Slice("GPU-0", 16384, 100).Obj())
	pod := vgputest.Pod("p").MemoryMiB(4096)
	for _, tt := range []struct {
		global, pod vgpu.Policy
		wantFuller  bool
	}{
		{"", "", true},
		{vgpu.PolicySpread, "", false},
		{vgpu.PolicySpread, vgpu.PolicyBinpack, true},
		{vgpu.PolicyBinpack, vgpu.PolicySpread, false},
		{vgpu.PolicyFragmentation, "", true},
	} {
		t.Run(string(tt.global)+"/"+string(tt.pod), func(t *testing.T) {
			t.Parallel()
			d := vgpu.PodDemand{Request: pod.PodRequest(), Constraints: vgpu.Constraints{NodePolicy: tt.pod}}
			opts := vgpu.FitOptions{NodePolicy: tt.global}
			full, err1 := vgpu.Fit(d, vgpu.NodeState{Inventory: node, Usage: half}, opts)
			empty, err2 := vgpu.Fit(d, vgpu.NodeState{Inventory: node}, opts)
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			fuller := vgpu.Score(full).Raw > vgpu.Score(empty).Raw
			if fuller != tt.wantFuller {
				t.Errorf("fuller node preferred = %v, want %v (scores %+v, %+v)", fuller, tt.wantFuller, vgpu.Score(full), vgpu.Score(empty))
			}
		})
	}
}

// TestNodeScoreCompare checks the order schedulers choose by: Value, then Raw, then Tie, with
// float noise below the epsilon a tie.
func TestNodeScoreCompare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b vgpu.NodeScore
		want int // sign
	}{
		{"value first", vgpu.NodeScore{Value: 60, Raw: 0.1}, vgpu.NodeScore{Value: 50, Raw: 0.9}, 1},
		{"raw breaks value ties", vgpu.NodeScore{Value: 50, Raw: 0.2}, vgpu.NodeScore{Value: 50, Raw: 0.3}, -1},
		{"tie breaks raw ties", vgpu.NodeScore{Value: 50, Raw: 0.2, Tie: 0.7}, vgpu.NodeScore{Value: 50, Raw: 0.2, Tie: 0.6}, 1},
		{"equal", vgpu.NodeScore{Value: 50, Raw: 0.2, Tie: 0.6}, vgpu.NodeScore{Value: 50, Raw: 0.2, Tie: 0.6}, 0},
		{"float noise is a tie", vgpu.NodeScore{Value: 50, Raw: 0.1 + 0.2}, vgpu.NodeScore{Value: 50, Raw: 0.3}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sign := func(n int) int { return max(-1, min(1, n)) }
			if got := sign(tc.a.Compare(tc.b)); got != tc.want {
				t.Errorf("%+v.Compare(%+v) sign = %d, want %d", tc.a, tc.b, got, tc.want)
			}
			if got := sign(tc.b.Compare(tc.a)); got != -tc.want {
				t.Errorf("%+v.Compare(%+v) sign = %d, want %d", tc.b, tc.a, got, -tc.want)
			}
		})
	}
}

// TestScoreWithoutGPU checks where the fragmentation policy sends a pod
// that asks for no GPU: where CPU is most in surplus over what the node's
// free GPU capacity will want, at the workload's CPU per GPU.
func TestScoreWithoutGPU(t *testing.T) {
	t.Parallel()
	// 4 CPUs per GPU of demand: one whole GPU with 4 CPUs.
	w := vgpu.NewWorkload(vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Host: vgpu.HostResources{CPUMilli: 4000}, Weight: 1})
	if got := w.CPUPerGPU(); got != 4000 {
		t.Fatalf("CPUPerGPU() = %v, want 4000", got)
	}
	idle := vgputest.Node("idle").GPU("idle-0", 16384).GPU("idle-1", 16384).Obj()
	full := vgputest.Node("full").GPU("full-0", 16384).GPU("full-1", 16384).Obj()
	fullUsage := vgputest.Usage(vgputest.Allocation("full").Slice("full-0", 16384, 100).Slice("full-1", 16384, 100).Obj())
	pod := vgpu.PodDemand{Host: vgpu.HostResources{CPUMilli: 2000}}
	opts := vgpu.FitOptions{NodePolicy: vgpu.PolicyFragmentation, Workload: w}
	score := func(inv vgpu.NodeInventory, u *vgpu.NodeUsage, cpu int64) vgpu.NodeScore {
		t.Helper()
		p, err := vgpu.Fit(pod, vgpu.NodeState{Inventory: inv, Usage: u, HostFree: &vgpu.HostResources{CPUMilli: cpu, MemoryMiB: 1 << 20}}, opts)
		if err != nil {
			t.Fatal(err)
		}
		return vgpu.Score(p)
	}
	// idle: 12 CPUs free, 2 free GPUs want 8: surplus 12 − 2 − 8 = 2 cores.
	// full: 6 CPUs free, no free GPU: surplus 6 − 2 = 4 cores.
	idleScore, fullScore := score(idle, nil, 12000), score(full, fullUsage, 6000)
	if want := (vgpu.NodeScore{Value: 52, Raw: 2}); idleScore != want {
		t.Errorf("idle node: Score() = %+v, want %+v", idleScore, want)
	}
	if want := (vgpu.NodeScore{Value: 54, Raw: 4}); fullScore != want {
		t.Errorf("full node: Score() = %+v, want %+v", fullScore, want)
	}
	// A node without GPUs is all surplus; without host figures Score
	// keeps its GPU measure (no healthy GPU: 0).
	if got := score(vgpu.NodeInventory{Node: "cpu"}, nil, 6000); got.Raw != 4 {
		t.Errorf("node without GPUs: Score().Raw = %v, want 4", got.Raw)
	}
	p, err := vgpu.Fit(pod, vgpu.NodeState{Inventory: vgpu.NodeInventory{Node: "cpu"}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := vgpu.Score(p); got != (vgpu.NodeScore{}) || p.HasCPUSurplus {
		t.Errorf("host unknown: Score() = %+v, HasCPUSurplus %v, want zero and false", got, p.HasCPUSurplus)
	}
}

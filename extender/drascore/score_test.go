package drascore

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestRankScores checks the ranking onto 0..10.
func TestRankScores(t *testing.T) {
	t.Parallel()
	s := func(v int, raw float64) *vgpu.NodeScore { return &vgpu.NodeScore{Value: v, Raw: raw} }
	got := Rank([]*vgpu.NodeScore{s(50, 0.5), nil, s(80, 0.8), s(50, 0.5), s(50, 0.4)})
	if diff := cmp.Diff([]int64{9, 0, 10, 9, 8}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	many := make([]*vgpu.NodeScore, 20)
	for i := range many {
		many[i] = s(i, 0)
	}
	if got := Rank(many); got[0] != 1 || got[19] != 10 || got[9] != 1 {
		t.Errorf("20 distinct scores: %v; want 10 down to 1, then 1", got)
	}
}

// BenchmarkPrioritizeDRA scores one DRA pod over 1,000 DRA nodes of 8 GPUs, each holding a few
// claims, under the fragmentation policy: the cost of one /dra/prioritize call without HTTP.
func BenchmarkPrioritizeDRA(b *testing.B) {
	const nodes = 1000
	d := newTestState()
	d.UpsertClass(vgputest.DRAClass())
	names := make([]string, nodes)
	for i := range nodes {
		names[i] = fmt.Sprintf("n%04d", i)
		d.UpsertSlice(vgputest.DRANodeSlice(names[i], 8, 81920, "NVIDIA A100-SXM4-80GB"))
		for k := range i % 5 {
			d.UpsertClaim(vgputest.Claim(fmt.Sprintf("held-%d-%d", i, k)).Allocated("gpu", names[i], fmt.Sprintf("gpu-%d", k), 20480, 20).Obj())
		}
	}
	pod, claim := vgputest.DRAPod("p", vgputest.Claim("p-gpu").Request("gpu", vgpu.DRADriverName, 1, 10240, 30))
	d.UpsertClaim(claim)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if _, ok := d.Score(ctx, pod, names); !ok {
			b.Fatal("not scored")
		}
	}
}

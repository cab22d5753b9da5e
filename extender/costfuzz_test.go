package extender

import (
	"context"
	"fmt"
	"strings"
	"testing"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/internal/fuzzcost"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

// Cost budgets of what a pod's author reaches in the extender, whatever the
// pod's placement annotations say and however long they are (measured on
// 16 nodes of 8 GPUs: a cold Filter of a pod at the limits, four lists of
// 32 items of 96 bytes, about 70 KB and 240 allocations; of a pod over
// them, under 10 KB and 100).
var (
	// demandBudget bounds cluster.DemandOf.
	demandBudget = fuzzcost.Cost{Allocs: 256, Bytes: 64 << 10}
	// filterBudget bounds a cold Filter over filterFuzzNodes nodes.
	filterBudget = fuzzcost.Cost{Allocs: 1000, Bytes: 256 << 10}
	// trimBudget bounds the trimmer on a pod: it copies at most a cut of
	// each annotation it keeps.
	trimBudget = fuzzcost.Cost{Allocs: 64, Bytes: 256 << 10}
)

// filterFuzzNodes is how many nodes FuzzFilterCost's Filter judges.
const filterFuzzNodes = 16

// maxErrorMessage bounds Filter's Error, which kube-scheduler writes into
// the pod's FailedScheduling event and condition.
const maxErrorMessage = 4 << 10

// FuzzFilterCost builds a GPU pod with the fuzzed placement annotations, as
// one created past the webhook may carry, and checks what the extender
// spends on it: the trimmer keeps at most a cut of each annotation it reads
// (trimBudget), cluster.DemandOf and a cold Filter over 16 nodes allocate no more
// than demandBudget and filterBudget, however long the values, and a pod
// whose annotations vgpu refuses gets Error, no node, and a message of at
// most maxErrorMessage.
func FuzzFilterCost(f *testing.F) {
	huge := strings.Repeat("40GB,", 40960)
	items := make([]string, vgpu.MaxListItems)
	for i := range items {
		items[i] = fmt.Sprintf("%096d", i)
	}
	atLimit := strings.Join(items, ",")
	f.Add("A100", "40GB", "", "", "binpack", "required")
	f.Add(huge, huge, huge, huge, huge, huge)
	f.Add(atLimit, atLimit, atLimit, atLimit, "spread", "")
	f.Add(",,,", strings.Repeat("x", 97), "node-00000-GPU-0", "node-00001-GPU-1", "fragmentation", "mps")
	s, names := benchScheduler(f, filterFuzzNodes, 4*filterFuzzNodes, vgpu.PolicyBinpack)
	trim := trimmer(vgpu.ResourceGPU, nil)
	f.Fuzz(func(t *testing.T, models, exclude, uuids, excludeUUIDs, policy, enforcement string) {
		pod := vgputest.Pod("p").Namespace("kube-system").
			Annotation(vgpu.AnnotationGPUModel, models).Annotation(vgpu.AnnotationGPUModelExclude, exclude).
			Annotation(vgpu.AnnotationGPUUUID, uuids).Annotation(vgpu.AnnotationGPUUUIDExclude, excludeUUIDs).
			Annotation(vgpu.AnnotationNodePolicy, policy).Annotation(vgpu.AnnotationGPUPolicy, policy).
			Annotation(vgpu.AnnotationEnforcement, enforcement).Annotation("hami.io/other", exclude).
			Container("main").GPU(1).MemoryMiB(2048).Obj()
		size := len(models) + 2*len(exclude) + len(uuids) + len(excludeUUIDs) + 2*len(policy) + len(enforcement)

		if cost := fuzzcost.Measure(fuzzcost.Runs, func() { _, _ = trim(pod) }); !cost.Within(trimBudget) {
			t.Fatalf("trimmer of a pod with %d bytes of annotations cost %+v, want at most %+v", size, cost, trimBudget)
		}
		if cost := fuzzcost.Measure(fuzzcost.Runs, func() { _, _ = cluster.DemandOf(pod) }); !cost.Within(demandBudget) {
			t.Fatalf("cluster.DemandOf a pod with %d bytes of annotations cost %+v, want at most %+v", size, cost, demandBudget)
		}
		args := &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}
		var got *extenderv1.ExtenderFilterResult
		cost := fuzzcost.MeasureFirst(func() {
			var err error
			if got, err = s.Filter(context.Background(), args); err != nil {
				t.Fatalf("Filter: %v", err)
			}
		})
		if !cost.Within(filterBudget) {
			t.Fatalf("Filter of a pod with %d bytes of annotations on %d nodes cost %+v, want at most %+v", size, len(names), cost, filterBudget)
		}
		if _, err := vgpu.ConstraintsFromPod(pod); err != nil {
			if got.Error == "" || got.NodeNames != nil && len(*got.NodeNames) > 0 {
				t.Fatalf("Filter of a pod vgpu refuses (%v) = %+v, want Error and no node", err, got)
			}
		}
		if n := len(got.Error); n > maxErrorMessage {
			t.Fatalf("Filter Error of %d bytes, want at most %d: %s", n, maxErrorMessage, vgpu.Abbreviate(got.Error))
		}
	})
}

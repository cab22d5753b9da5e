package extender

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// goldenCluster is a fixed cluster with one node per kind of answer.
func goldenCluster() []runtime.Object {
	a100 := func(name string, gpus int) vgpu.NodeInventory {
		b := vgputest.Node(name)
		for i := range gpus {
			b.GPU(name+"-GPU-"+string(rune('0'+i)), 81920)
		}
		return b.Obj()
	}
	t4 := vgputest.Node("t4").GPU("t4-GPU-0", 15360).Model("t4-GPU-0", "Tesla T4").Obj()
	var objs []runtime.Object
	for _, inv := range []vgpu.NodeInventory{a100("a100-empty", 2), a100("a100-half", 1), a100("a100-busy", 1), t4, a100("not-ready", 1), a100("stale", 1)} {
		node := vgputest.PublishedNode(inv)
		renewed := now.Add(-5 * time.Second)
		switch inv.Node {
		case "not-ready":
			node.Ready(false)
		case "stale":
			renewed = now.Add(-10 * time.Minute)
		}
		objs = append(objs, node.Obj(), vgputest.HeartbeatLease(inv.Node, renewed).Obj())
	}
	return append(objs,
		boundPod(vgputest.Pod("half").Container("main").GPU(1).MemoryMiB(40960),
			vgputest.Allocation("a100-half").Container("main").Slice("a100-half-GPU-0", 40960, 0).Obj()),
		boundPod(vgputest.Pod("busy").Container("main").GPU(1).MemoryMiB(78000),
			vgputest.Allocation("a100-busy").Container("main").Slice("a100-busy-GPU-0", 78000, 0).Obj()),
	)
}

// TestExtenderGolden checks the exact /filter and /prioritize answers for
// goldenCluster and a pod asking for 8 GiB and 30% of one A100, with Filter
// passing the best nodes (the default) and every feasible node.
func TestExtenderGolden(t *testing.T) {
	pod := vgputest.Pod("train").Annotation(vgpu.AnnotationGPUModel, "A100").Container("main").GPU(1).MemoryMiB(8192).Cores(30).Obj()
	names := []string{"a100-empty", "a100-half", "a100-busy", "t4", "not-ready", "stale", "ghost"}
	args := extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}
	for _, result := range []FilterResult{FilterResultBest, FilterResultFeasible} {
		cfg := testConfig()
		cfg.FilterResult = result
		e := newEnv(t, cfg, goldenCluster()...)
		waitFor(t, "bound pods counted", func() bool { return e.s.NodeUsage("a100-busy").GPU("a100-busy-GPU-0").MemoryMiB == 78000 })
		for _, verb := range []string{"filter", "prioritize"} {
			golden := verb
			if result == FilterResultFeasible {
				if verb == "prioritize" {
					continue // the same answer in both
				}
				golden += "-feasible"
			}
			t.Run(golden, func(t *testing.T) {
				code, body := e.post("/"+verb, args, nil)
				if code != 200 {
					t.Fatalf("HTTP %d: %s", code, body)
				}
				var got bytes.Buffer
				if err := json.Indent(&got, []byte(body), "", "  "); err != nil {
					t.Fatal(err)
				}
				checkGolden(t, filepath.Join("testdata", golden+".golden.json"), got.Bytes())
			})
		}
	}
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil { //nolint:gosec // G306: a checked-in test file.
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./extender/ -run Golden -update)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

package extender

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestBindRace sends 200 binds at once, over HTTP, onto 2 nodes of 2 GPUs
// (16384 MiB, 4 slices each): far more than fit. No GPU may end up holding
// more memory, slices or cores than it has; every pod that did not fit
// gets an error and keeps no allocation; and a Scheduler started afresh on
// the same API server counts exactly the same usage.
func TestBindRace(t *testing.T) {
	const pods = 200
	var invs []*vgpu.NodeInventory
	var objs []runtime.Object
	for _, name := range []string{"n0", "n1"} {
		inv := vgputest.Node(name).SplitCount(4).GPU(name+"-GPU-0", 16384).GPU(name+"-GPU-1", 16384).Obj()
		invs = append(invs, &inv)
		objs = append(objs, vgputest.PublishedNode(inv).Obj(), vgputest.HeartbeatLease(name, now).Obj())
	}
	memory := []int64{2048, 3072, 5120, 7168}
	for i := range pods {
		objs = append(objs, vgputest.Pod(fmt.Sprintf("race-%03d", i)).Container("main").
			GPU(1).MemoryMiB(memory[i%len(memory)]).Cores(10+10*(i%3)).Obj())
	}
	e := newEnv(t, testConfig(), objs...)

	results := make([]extenderv1.ExtenderBindingResult, pods)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			<-start
			name := fmt.Sprintf("race-%03d", i)
			args := extenderv1.ExtenderBindingArgs{PodName: name, PodNamespace: "default", PodUID: types.UID("uid-" + name), Node: invs[i%2].Node}
			if code, body := e.post("/bind", args, &results[i]); code != 200 {
				results[i].Error = fmt.Sprintf("HTTP %d: %s", code, body)
			}
		})
	}
	close(start)
	wg.Wait()
	e.settled()

	held := map[string]vgpu.GPUUsage{}
	bound := 0
	for i, r := range results {
		pod := e.getPod(vgputest.Pod(fmt.Sprintf("race-%03d", i)).Obj())
		raw := pod.Annotations[vgpu.AnnotationPodAllocation]
		if r.Error != "" {
			if !strings.HasPrefix(r.Error, "node n") || raw != "" || pod.Spec.NodeName != "" {
				t.Errorf("%s: failed with %q, left allocation %q on node %q; want a fit error and nothing left", pod.Name, r.Error, raw, pod.Spec.NodeName)
			}
			continue
		}
		bound++
		alloc, err := vgpu.ParsePodAllocation(raw)
		if err != nil || pod.Spec.NodeName != alloc.Node || alloc.Node != invs[i%2].Node {
			t.Errorf("%s: bound to %q with allocation %q (%v)", pod.Name, pod.Spec.NodeName, raw, err)
			continue
		}
		for _, s := range alloc.Containers[0].GPUs {
			u := held[s.UUID]
			u.MemoryMiB += s.MemoryMiB
			u.CoresPercent += s.CoresPercent
			u.Slices++
			held[s.UUID] = u
		}
	}
	for uuid, u := range held {
		if u.MemoryMiB > 16384 || u.Slices > 4 || u.CoresPercent > 100 {
			t.Errorf("%s over-committed: %+v", uuid, u)
		}
	}
	if bound == 0 || bound == pods {
		t.Errorf("%d of %d pods bound; want some but not all", bound, pods)
	}
	t.Logf("%d of %d pods bound", bound, pods)

	counted := map[string]vgpu.GPUUsage{}
	for _, inv := range invs {
		for uuid, u := range usageTable(e.s, inv) {
			counted[uuid] = u
		}
	}
	if diff := cmp.Diff(held, counted); diff != "" {
		t.Errorf("usage counted by the extender differs from the annotations (-annotations +counted):\n%s", diff)
	}

	restarted := startEnv(t, testConfig(), e.client)
	for _, inv := range invs {
		if diff := cmp.Diff(usageTable(e.s, inv), usageTable(restarted.s, inv)); diff != "" {
			t.Errorf("%s after restart (-before +after):\n%s", inv.Node, diff)
		}
	}
}

package extender

import (
	"fmt"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// benchScheduler is a Scheduler whose state holds that many published nodes of
// 8 A100s (80 GiB), each with two bound pods, fed straight into the state
// as the informers would.
func benchScheduler(b *testing.B, nodes int) (*Scheduler, []string) {
	b.Helper()
	s, err := New(testConfig(), Options{Client: fake.NewClientset(), Clock: clocktesting.NewFakePassiveClock(now)})
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, nodes)
	for i := range nodes {
		name := fmt.Sprintf("node-%05d", i)
		names[i] = name
		nb := vgputest.Node(name)
		for g := range 8 {
			nb.GPU(fmt.Sprintf("%s-GPU-%d", name, g), 81920)
		}
		inv := nb.Obj()
		s.state.upsertNode(vgputest.PublishedNode(inv).Obj())
		s.state.upsertLease(vgputest.HeartbeatLease(name, now).Obj())
		for p := range 2 {
			uuid := inv.GPUs[(i+p*3)%8].UUID
			pod := boundPod(vgputest.Pod(fmt.Sprintf("%s-pod-%d", name, p)).Container("main").GPU(1).MemoryMiB(40960).Cores(50),
				vgputest.Allocation(name).Container("main").Slice(uuid, 40960, 50).Obj())
			if err := s.state.upsertPod(pod); err != nil {
				b.Fatal(err)
			}
		}
	}
	s.synced.Store(true) // as WatchCluster does once the lists are counted
	return s, names
}

// benchFilterArgs is benchScheduler over 5,000 nodes and the arguments of
// one pod (1 GPU, 20 GiB, 30%) over all of them, as kube-scheduler sends
// them with nodeCacheCapable. It reports allocations.
func benchFilterArgs(b *testing.B) (*Scheduler, *extenderv1.ExtenderArgs) {
	b.Helper()
	s, names := benchScheduler(b, 5000)
	pod := vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(20480).Cores(30).Obj()
	b.ReportAllocs()
	return s, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}
}

// BenchmarkFilter filters the pod of benchFilterArgs, without HTTP.
func BenchmarkFilter(b *testing.B) {
	s, args := benchFilterArgs(b)
	ctx := b.Context()
	for b.Loop() {
		res, err := s.Filter(ctx, args)
		if err != nil {
			b.Fatalf("Filter: %v", err)
		}
		if len(*res.NodeNames) != len(*args.NodeNames) {
			b.Fatalf("Filter: %d of %d nodes passed", len(*res.NodeNames), len(*args.NodeNames))
		}
	}
}

// BenchmarkPrioritize scores the same pod over the same nodes.
func BenchmarkPrioritize(b *testing.B) {
	s, args := benchFilterArgs(b)
	ctx := b.Context()
	for b.Loop() {
		if _, err := s.Prioritize(ctx, args); err != nil {
			b.Fatal(err)
		}
	}
}

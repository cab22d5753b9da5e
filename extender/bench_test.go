package extender

import (
	"fmt"
	"math/rand/v2"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

// benchModels are the GPU models of the benchmark's nodes, one model per
// node in turn, as in a cluster of mixed node pools.
var benchModels = []struct {
	model     string
	memoryMiB int64
}{
	{"NVIDIA A100-SXM4-80GB", 81920}, {"Tesla V100-SXM2-32GB", 32768}, {"NVIDIA A10", 23028},
	{"Tesla T4", 15360}, {"NVIDIA L4", 23034}, {"NVIDIA H100 80GB HBM3", 81559},
}

// benchSlices are the six slice sizes (MiB, cores %) of the benchmark's
// pods, placed and asked for in turn.
var benchSlices = []benchSlice{{memoryMiB: 1024, cores: 5}, {memoryMiB: 2048, cores: 10}, {memoryMiB: 4096, cores: 10},
	{memoryMiB: 8192, cores: 20}, {memoryMiB: 16384, cores: 30}, {memoryMiB: 40960, cores: 50}}

// benchPercentSlices are six slice sizes given as shares of a GPU
// (hami.io/gpumem-percentage and cores %), as the FGD trace's pods ask: a
// workload of such slices learns expected-fill tables (vgpu/fill.go).
var benchPercentSlices = []benchSlice{{memoryPercent: 5, cores: 5}, {memoryPercent: 10, cores: 10}, {memoryPercent: 25, cores: 25},
	{memoryPercent: 30, cores: 30}, {memoryPercent: 50, cores: 50}, {memoryPercent: 70, cores: 70}}

// benchSlice is one slice size of the benchmark's pods: memoryMiB, or else
// memoryPercent of the GPU's memory, and cores percent.
type benchSlice struct {
	memoryMiB     int64
	memoryPercent int
	cores         int
}

// builder returns a pod named name asking for the slice on one GPU.
func (sl benchSlice) builder(name string) *vgputest.PodBuilder {
	pb := vgputest.Pod(name).Container("main").GPU(1).Cores(sl.cores)
	if sl.memoryPercent > 0 {
		return pb.MemoryPercent(sl.memoryPercent)
	}
	return pb.MemoryMiB(sl.memoryMiB)
}

// pod returns a pod named name asking for the slice on one GPU, and 4 CPUs
// and 16 GiB of the host, as GPU pods do.
func (sl benchSlice) pod(name string) *corev1.Pod {
	return sl.builder(name).Request(corev1.ResourceCPU, "4").Request(corev1.ResourceMemory, "16Gi").Obj()
}

// benchScheduler is a synced Scheduler over nodes published nodes of 8 GPUs
// (benchModels in turn), 96 CPUs and 512 GiB with slices pods of one slice each already bound,
// fed straight into the state as the informers would: each pod of
// benchSlices in turn, on a random node where vgpu.Fit places it under
// policy, so GPUs fill unevenly as in a real cluster. Seeded: the same
// arguments give the same cluster.
func benchScheduler(b testing.TB, nodes, slicesPlaced int, policy vgpu.Policy) (*Scheduler, []string) {
	b.Helper()
	return benchSchedulerOf(b, nodes, slicesPlaced, policy, benchSlices)
}

// benchSchedulerOf is benchScheduler with the slices shapes placed in turn.
func benchSchedulerOf(b testing.TB, nodes, slicesPlaced int, policy vgpu.Policy, shapes []benchSlice) (*Scheduler, []string) {
	b.Helper()
	cfg := testConfig()
	cfg.NodePolicy, cfg.GPUPolicy = policy, policy
	s, err := New(cfg, Options{Client: fake.NewClientset(), Clock: clocktesting.NewFakePassiveClock(now)})
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, nodes)
	invs := make([]vgpu.NodeInventory, nodes)
	for i := range nodes {
		name := fmt.Sprintf("node-%05d", i)
		names[i] = name
		m := benchModels[i%len(benchModels)]
		nb := vgputest.Node(name)
		for g := range 8 {
			uuid := fmt.Sprintf("%s-GPU-%d", name, g)
			nb.GPU(uuid, m.memoryMiB).Model(uuid, m.model)
		}
		invs[i] = nb.Obj()
		// As kubelets report them: the fragmentation policy then weighs
		// the nodes' free CPU and memory.
		node := vgputest.PublishedNode(invs[i]).Obj()
		node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("96")
		node.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("512Gi")
		s.state.UpsertNode(node)
		s.state.UpsertLease(vgputest.HeartbeatLease(name, now).Obj())
	}
	rng := rand.New(rand.NewPCG(42, 7)) // the same cluster for the same arguments
	opts := s.fitOptions
	opts.Unscored = true
	for placed, tries := 0, 0; placed < slicesPlaced && tries < 4*slicesPlaced; tries++ {
		sl := shapes[tries%len(shapes)]
		i := rng.IntN(nodes)
		pb := sl.builder(fmt.Sprintf("placed-%06d", tries))
		pod := vgpu.PodDemand{Request: pb.PodRequest()}
		p, err := s.state.Summary(names[i]).Fit(pod, opts)
		if err != nil {
			continue
		}
		if err := s.state.UpsertPod(boundPod(pb, p.Allocation)); err != nil {
			b.Fatal(err)
		}
		s.workload.add(pod) // as podArrived does
		placed++
	}
	// The online workload learnt from those pods, with the cluster's GPUs
	// as its supply, as workloadLoop publishes it.
	if w := s.workload.snapshot(); w != nil {
		s.state.SetWorkload(w)
	}
	s.synced.Store(true) // as WatchCluster does once the lists are counted
	// What building the cluster left behind (decoded annotations, test
	// objects) is collected here, not during the first pods measured.
	goruntime.GC()
	return s, names
}

// BenchmarkFilterPrioritize is one pod's Filter and then Prioritize over
// 5,000 nodes of 8 GPUs holding 40,000 slices, in-process (no HTTP), as
// kube-scheduler calls them with nodeCacheCapable: Prioritize gets the
// nodes Filter passed. The online workload has learnt the placed slices.
// Per node and GPU policy, and per set of slices (benchSlices, in MiB;
// "-percent": benchPercentSlices, shares of a GPU, whose workload learns
// expected-fill tables), two cases:
//   - cold: every node's remembered verdicts are dropped before each pod,
//     so every node is judged afresh (the first pod of a new shape);
//   - burst: pods of the set's six shapes in turn, each reserved on
//     its best node afterwards as Bind would, so each pod finds one changed
//     node per earlier pod (a job's replicas arriving together); measured
//     once each shape has arrived once.
//
// It reports p50 and p99 of the pair in ms, allocations per pair, the
// ratio of the p50 to a do-nothing extender measured in the same run (look
// up each node, pass it, score it 0) and, in the cold case, how many
// nodes Filter fitted per pod (the rest its screen and bounds decided).
func BenchmarkFilterPrioritize(b *testing.B) {
	const nodes, placed = 5000, 40000
	for _, policy := range vgpu.Policies() {
		for _, set := range []struct {
			suffix string
			shapes []benchSlice
		}{{"", benchSlices}, {"-percent", benchPercentSlices}} {
			benchFilterPrioritize(b, string(policy)+set.suffix, nodes, placed, policy, set.shapes)
		}
	}
}

// benchFilterPrioritize runs BenchmarkFilterPrioritize's cold and burst
// cases for one policy and one set of slice shapes.
func benchFilterPrioritize(b *testing.B, name string, nodes, placed int, policy vgpu.Policy, shapes []benchSlice) {
	s, names := benchSchedulerOf(b, nodes, placed, policy, shapes)
	base := benchBaseline(s, names)
	// Pod names go on from run to run: with -count, a sub-benchmark
	// runs again on the same cluster, which holds the pods reserved
	// before.
	i := 0
	for _, mode := range []string{"cold", "burst"} {
		b.Run(name+"/"+mode, func(b *testing.B) {
			var took []time.Duration
			if mode == "burst" {
				// The first pod of each shape is the cold case: a burst
				// is measured once every shape has arrived.
				for range shapes {
					pod := shapes[i%len(shapes)].pod(fmt.Sprintf("warm-%d", i))
					benchBind(b, s, pod, benchPair(b, s, names, pod))
					i++
				}
			}
			b.ReportAllocs()
			fitted := 0
			for b.Loop() {
				if mode == "cold" {
					b.StopTimer()
					s.state.ForgetVerdicts()
					b.StartTimer()
				}
				pod := shapes[i%len(shapes)].pod(fmt.Sprintf("bench-%06d", i))
				i++
				start := time.Now()
				scores := benchPair(b, s, names, pod)
				took = append(took, time.Since(start))
				b.StopTimer()
				if mode == "burst" {
					benchBind(b, s, pod, scores)
				} else {
					fitted += benchFitted(b, s, pod)
				}
				b.StartTimer()
			}
			slices.Sort(took)
			p50, p99 := took[len(took)/2], took[(len(took)*99)/100]
			b.ReportMetric(ms(p50), "p50-ms")
			b.ReportMetric(ms(p99), "p99-ms")
			b.ReportMetric(float64(p50)/float64(base), "x-baseline")
			if mode == "cold" {
				b.ReportMetric(float64(fitted)/float64(len(took)), "fitted/op")
			}
		})
	}
}

// benchPair runs pod's Filter over names and its Prioritize over the
// nodes Filter passed, as kube-scheduler does, and returns the scores.
func benchPair(b *testing.B, s *Scheduler, names []string, pod *corev1.Pod) extenderv1.HostPriorityList {
	b.Helper()
	res, err := s.Filter(b.Context(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
	if err != nil {
		b.Fatal(err)
	}
	scores, err := s.Prioritize(b.Context(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: res.NodeNames})
	if err != nil {
		b.Fatal(err)
	}
	return scores
}

// benchFitted counts the nodes that remember a verdict for pod, not a
// bound: in the cold case, the nodes its Filter fitted (the screen
// remembers none).
func benchFitted(b *testing.B, s *Scheduler, pod *corev1.Pod) int {
	b.Helper()
	d, err := cluster.DemandOf(pod)
	if err != nil {
		b.Fatal(err)
	}
	return s.state.Fitted(&d)
}

// benchBind reserves pod on its best-scored node, as a Bind would.
func benchBind(b *testing.B, s *Scheduler, pod *corev1.Pod, scores extenderv1.HostPriorityList) {
	b.Helper()
	if len(scores) == 0 {
		return
	}
	best := scores[0]
	for _, h := range scores[1:] {
		if h.Score > best.Score {
			best = h
		}
	}
	d, err := cluster.DemandOf(pod)
	if err != nil {
		b.Fatal(err)
	}
	d.ForBind = true
	if _, err := s.reserve(best.Host, &d); err != nil {
		b.Fatalf("reserve on %s: %v", best.Host, err)
	}
}

// benchBaseline is the median time of a do-nothing extender's Filter and
// Prioritize over names: look each node up, pass it, score it 0.
func benchBaseline(s *Scheduler, names []string) time.Duration {
	var took []time.Duration
	for range 50 {
		start := time.Now()
		passed := make([]string, 0, len(names))
		s.state.Known(names, func(i int) { passed = append(passed, names[i]) })
		list := make(extenderv1.HostPriorityList, len(passed))
		for i, name := range passed {
			list[i].Host = name
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	return took[len(took)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkFilter filters one pod (1 GPU, 20 GiB, 30%) over 2,000 nodes of
// benchScheduler with 16,000 slices, without HTTP: the figure of earlier
// releases, kept for comparison.
func BenchmarkFilter(b *testing.B) {
	s, names := benchScheduler(b, 2000, 16000, vgpu.PolicyBinpack)
	pod := vgputest.Pod("p").Container("main").GPU(1).MemoryMiB(20480).Cores(30).Obj()
	pod.UID = types.UID("uid-bench")
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Filter(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}); err != nil {
			b.Fatalf("Filter: %v", err)
		}
	}
}

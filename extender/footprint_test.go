package extender

import (
	"context"
	"fmt"
	goruntime "runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// BenchmarkCacheFootprint is the extender's Go heap, in MiB, once its
// informers synced a cluster of 5,000 nodes of 8 GPUs (each with its
// heartbeat Lease, allocatable CPU and memory, a label and an image, as
// kubelets report them), 5,000 bound GPU pods and 45,000 bound pods
// without GPUs: the live heap after the caches and the state are built,
// less the heap before the Scheduler started (the fake clientset's own
// copies). Each iteration builds and syncs a new Scheduler.
func BenchmarkCacheFootprint(b *testing.B) {
	const nodes, cpuPodsPerNode = 5000, 9
	var objs []runtime.Object
	for i := range nodes {
		name := fmt.Sprintf("node-%05d", i)
		nb := vgputest.Node(name)
		for g := range 8 {
			nb.GPU(fmt.Sprintf("%s-GPU-%d", name, g), 81920)
		}
		n := vgputest.PublishedNode(nb.Obj()).Obj()
		n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("96")
		n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("512Gi")
		n.Status.Capacity = n.Status.Allocatable.DeepCopy()
		n.Labels[corev1.LabelHostname] = name
		n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 320000}}
		objs = append(objs, n, vgputest.HeartbeatLease(name, now).Obj())
		for j := range cpuPodsPerNode {
			p := vgputest.Pod(fmt.Sprintf("cpu-%05d-%d", i, j)).Container("main").Limit(corev1.ResourceCPU, "1").Obj()
			p.Spec.NodeName = name
			p.Labels = map[string]string{"app": "web", "pod-template-hash": "7d9f8c6b5"}
			objs = append(objs, p)
		}
		alloc := vgputest.Allocation(name).Container("main").Slice(name+"-GPU-0", 4096, 0).Obj()
		objs = append(objs, boundPod(vgputest.Pod(fmt.Sprintf("gpu-%05d", i)).Container("main").GPU(1).MemoryMiB(4096), alloc))
	}
	client := fake.NewClientset(objs...)
	var mib float64
	for b.Loop() {
		before := liveHeap()
		s, err := New(testConfig(), Options{Client: client})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.WatchCluster(ctx) }()
		waitFor(b, "informers synced", s.Ready)
		mib = float64(liveHeap()-before) / (1 << 20)
		goruntime.KeepAlive(s)
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(mib, "heap-MiB")
}

// liveHeap is the heap in use by reachable objects, after two collections.
func liveHeap() uint64 {
	goruntime.GC()
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return m.HeapAlloc
}

package extender

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// cpuPodCluster is two nodes for a pod without GPUs: "idle", 4 free GPUs
// and 12 CPUs free, and "full", both GPUs held by whole-GPU pods of 4 CPUs
// each and 6 CPUs free. The online workload learns 4 CPUs per GPU from
// those pods, so idle's free GPUs will want 16 CPUs (surplus 12 − 2 − 16 =
// −6 cores for a pod of 2) and full's none (surplus 6 − 2 = 4).
func cpuPodCluster(t *testing.T) []runtime.Object {
	t.Helper()
	withCPU := func(objs []runtime.Object, cpu string) []runtime.Object {
		n := objs[0].(*corev1.Node)
		n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(cpu)
		n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("64Gi")
		return objs
	}
	_, idle := gpuNode("idle", 4, 16384)
	invFull, full := gpuNode("full", 2, 16384)
	objs := objects(withCPU(idle, "12"), withCPU(full, "14"))
	for i, g := range invFull.GPUs {
		alloc := vgputest.Allocation("full").Container("main").Slice(g.UUID, 16384, 100).Obj()
		objs = append(objs, boundPod(vgputest.Pod("whole-"+string(rune('a'+i))).Container("main").GPU(1).Limit(corev1.ResourceCPU, "4"), alloc))
	}
	return objs
}

// TestFilterPodWithoutGPU checks that under the fragmentation policy a
// pod without GPUs is sent where CPU is most in surplus over what the
// node's free GPUs will want, not where most CPU is free, and that under
// other policies it passes every node unscored.
func TestFilterPodWithoutGPU(t *testing.T) {
	t.Parallel()
	pod := vgputest.Pod("cpu").Container("main").Limit(corev1.ResourceCPU, "2").Obj()
	cfg := testConfig()
	cfg.NodePolicy, cfg.GPUPolicy = vgpu.PolicyFragmentation, vgpu.PolicyFragmentation
	e := newEnv(t, cfg, cpuPodCluster(t)...)
	waitFor(t, "the workload learnt from the bound pods", func() bool {
		return e.s.state.Workload().CPUPerGPU() == 4000
	})
	got := e.filter(pod, "idle", "full", "unknown")
	if diff := cmp.Diff([]string{"full"}, *got.NodeNames); diff != "" {
		t.Errorf("fragmentation: nodes passed (-want +got):\n%s", diff)
	}
	if len(got.FailedNodes)+len(got.FailedAndUnresolvableNodes) != 0 {
		t.Errorf("fragmentation: a pod without GPUs failed nodes: %v %v", got.FailedNodes, got.FailedAndUnresolvableNodes)
	}
	scores := map[string]int64{}
	for _, h := range e.prioritize(pod, "idle", "full") {
		scores[h.Host] = h.Score
	}
	if scores["full"] <= scores["idle"] {
		t.Errorf("fragmentation: prioritize scores %v, want full above idle", scores)
	}

	binpack := newEnv(t, testConfig(), cpuPodCluster(t)...)
	if got := binpack.filter(pod, "idle", "full", "unknown"); len(*got.NodeNames) != 3 {
		t.Errorf("binpack: nodes passed %v, want every node", *got.NodeNames)
	}
}

// TestBindPodWithoutGPUCountsHost checks that binding a pod without GPUs
// counts its CPU on the node at once, and that a failed bind counts
// nothing.
func TestBindPodWithoutGPUCountsHost(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		pod := vgputest.Pod("cpu").Container("main").Limit(corev1.ResourceCPU, "2").Obj()
		client := newFakeClient(append(cpuPodCluster(t), pod)...)
		if fail {
			client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				return a.GetSubresource() == "binding", nil, apierrors.NewInternalError(errors.New("etcd is on fire"))
			})
		}
		e := startEnv(t, testConfig(), client)
		res := e.bind(pod, "idle")
		if (res.Error != "") != fail {
			t.Fatalf("fail=%v: bind error %q", fail, res.Error)
		}
		want := int64(10000)
		if fail {
			want = 12000
		}
		idle, _ := e.s.state.Node("idle")
		free := idle.HostFree.CPUMilli
		if free != want {
			t.Errorf("fail=%v: idle's free CPU after the bind = %d, want %d", fail, free, want)
		}
	}
}

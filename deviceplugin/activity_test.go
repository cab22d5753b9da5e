package deviceplugin

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpuslice/gpuslice/deviceplugin/clientset"
	"github.com/gpuslice/gpuslice/internal/metricstest"
	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestParseProcessCgroup(t *testing.T) {
	const (
		uid = "0c5e5a1e-4b1f-4f8e-9a51-2d3c4b5a6f70"
		cid = "4f1b7f3f0b6c4c1e9d2a8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b"
	)
	tests := []struct {
		name   string
		cgroup string
		want   processContainer
		wantOK bool
	}{
		{"cgroupfs v1", "12:memory:/kubepods/burstable/pod" + uid + "/" + cid + "\n11:cpu:/kubepods/burstable/pod" + uid + "/" + cid + "\n",
			processContainer{uid, cid}, true},
		{"guaranteed pod", "0::/kubepods/pod" + uid + "/" + cid + "\n", processContainer{uid, cid}, true},
		{"systemd v2, containerd", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + cid + ".scope\n",
			processContainer{uid, cid}, true},
		{"systemd, CRI-O", "0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/crio-" + cid + ".scope\n", processContainer{uid, cid}, true},
		{"the pod's own cgroup, no container", "0::/kubepods/burstable/pod" + uid + "\n", processContainer{}, false},
		{"host process", "0::/system.slice/sshd.service\n", processContainer{}, false},
		{"garbage", "not a cgroup file", processContainer{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseProcessCgroup([]byte(tt.cgroup))
			if ok != tt.wantOK || got != tt.want {
				t.Errorf("parseProcessCgroup = %+v, %v; want %+v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// TestContainerGPUMetrics scrapes the plugin's per-GPU and per-container
// metrics over fake GPUs with simulated processes, a real pod informer on
// client-go's fake API, a fake PodResources API and a fake /proc: each
// process's memory lands on the container its cgroup names, beside that
// container's limit; a host process's memory is unattributed.
func TestContainerGPUMetrics(t *testing.T) {
	const (
		uidTrain = "0c5e5a1e-4b1f-4f8e-9a51-2d3c4b5a6f70"
		uidEval  = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
		cidTrain = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		cidEval  = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	)
	logger, ctx := ktesting.NewTestContext(t)
	lib, err := nvidia.NewFake("2xA100-80GB", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	backend, err := nvidia.Open(nvidia.Options{Library: lib, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = backend.Close() })
	gpu0, gpu1 := nvidia.FakeUUID("node-1", 0), nvidia.FakeUUID("node-1", 1)

	procDir := t.TempDir()
	writeCgroup := func(pid, content string) {
		if err := os.MkdirAll(filepath.Join(procDir, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(procDir, pid, "cgroup"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeCgroup("100", "0::/kubepods/burstable/pod"+uidTrain+"/"+cidTrain+"\n")
	writeCgroup("200", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+strings.ReplaceAll(uidEval, "-", "_")+".slice/cri-containerd-"+cidEval+".scope\n")
	writeCgroup("300", "0::/system.slice/sshd.service\n")
	if err := lib.SetProcesses(0, nvidia.FakeProcess{PID: 100, MemoryMiB: 9000}, nvidia.FakeProcess{PID: 200, MemoryMiB: 5000}, nvidia.FakeProcess{PID: 300, MemoryMiB: 500}); err != nil {
		t.Fatal(err)
	}
	if err := lib.SetProcesses(1, nvidia.FakeProcess{PID: 200, MemoryMiB: 1000}, nvidia.FakeProcess{PID: 999, MemoryMiB: 10}); err != nil {
		t.Fatal(err)
	}
	if err := lib.SetUtilization(0, 85); err != nil {
		t.Fatal(err)
	}

	pod := func(name, uid, container, cid string, alloc *vgpu.PodAllocation) *corev1.Pod {
		p := gpuPod(name, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), alloc, container)
		p.UID = types.UID(uid)
		p.Status.Phase = corev1.PodRunning
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: container, ContainerID: "containerd://" + cid}}
		return p
	}
	client := fake.NewClientset(
		pod("train", uidTrain, "main", cidTrain, allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpu0, 10240, 30))),
		pod("eval", uidEval, "eval", cidEval, allocOf(vgputest.Allocation("node-1").Container("eval").Slice(gpu0, 4096, 20).Slice(gpu1, 2048, 0))),
	)
	view, err := newPodView(clientset.New(client).NodePods("node-1"), "node-1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	view.start(ctx)
	t.Cleanup(func() { cancel(); view.stop() })
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return view.HasSynced() && len(view.Pods()) == 2, nil
	}); err != nil {
		t.Fatal("the pod view never listed both pods")
	}
	podResources := newFakePodResources()
	ns := vgputest.Pod("x").Obj().Namespace
	podResources.hold(ns, "train", "main", DeviceID(gpu0, 0))
	podResources.hold(ns, "eval", "eval", DeviceID(gpu0, 1), DeviceID(gpu1, 0))

	cfg := validConfig()
	cfg.ProcDir = procDir
	p, err := New(cfg, backend, Options{})
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := backend.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	inv, err := newInventory(cfg, gpus)
	if err != nil {
		t.Fatal(err)
	}
	p.inv.Store(inv)
	p.alloc.Store(&allocator{cfg: cfg, inv: inv, pods: view, lister: podResources})

	srv := httptest.NewServer(p.ProbeHandler())
	t.Cleanup(srv.Close)
	got := metricstest.Pick(metricstest.Scrape(t, srv.Client(), srv.URL+"/metrics"),
		MetricGPUMemoryTotal, MetricGPUMemoryAllocated, MetricGPUCoresAllocated, MetricGPUSlicesAllocated, MetricGPUMemoryUsed, MetricGPUUtilization,
		MetricGPUMemoryUnattributed, MetricContainerGPUMemoryUsed, MetricContainerGPUMemoryLimit, MetricContainerGPUCoresLimit, MetricGPUXIDs)
	s := metricstest.Series
	c := func(name, pod, container, gpu string) string {
		return s(name, "namespace", ns, "pod", pod, "container", container, "gpu", gpu)
	}
	want := map[string]float64{
		s(MetricGPUMemoryTotal, "gpu", gpu0): 81920, s(MetricGPUMemoryTotal, "gpu", gpu1): 81920,
		s(MetricGPUMemoryAllocated, "gpu", gpu0): 14336, s(MetricGPUMemoryAllocated, "gpu", gpu1): 2048,
		s(MetricGPUCoresAllocated, "gpu", gpu0): 50, s(MetricGPUCoresAllocated, "gpu", gpu1): 0,
		s(MetricGPUSlicesAllocated, "gpu", gpu0): 2, s(MetricGPUSlicesAllocated, "gpu", gpu1): 1,
		s(MetricGPUMemoryUsed, "gpu", gpu0): 14500, s(MetricGPUMemoryUsed, "gpu", gpu1): 1010,
		s(MetricGPUUtilization, "gpu", gpu0): 85, s(MetricGPUUtilization, "gpu", gpu1): 0,
		s(MetricGPUMemoryUnattributed, "gpu", gpu0): 500, s(MetricGPUMemoryUnattributed, "gpu", gpu1): 10,
		c(MetricContainerGPUMemoryUsed, "train", "main", gpu0):  9000,
		c(MetricContainerGPUMemoryUsed, "eval", "eval", gpu0):   5000,
		c(MetricContainerGPUMemoryUsed, "eval", "eval", gpu1):   1000,
		c(MetricContainerGPUMemoryLimit, "train", "main", gpu0): 10240,
		c(MetricContainerGPUMemoryLimit, "eval", "eval", gpu0):  4096,
		c(MetricContainerGPUMemoryLimit, "eval", "eval", gpu1):  2048,
		c(MetricContainerGPUCoresLimit, "train", "main", gpu0):  30,
		c(MetricContainerGPUCoresLimit, "eval", "eval", gpu0):   20,
		c(MetricContainerGPUCoresLimit, "eval", "eval", gpu1):   0,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

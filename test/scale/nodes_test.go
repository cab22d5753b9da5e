package scale

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/simulate"
)

func TestFixedNodes(t *testing.T) {
	t.Parallel()
	rows := []simulate.Node{
		{Name: "a", CPUMilli: 64000, MemoryMiB: 262144, GPUs: 2, Model: "P100"},
		{Name: "cpu", CPUMilli: 32000, MemoryMiB: 131072},
		{Name: "b", CPUMilli: 96000, MemoryMiB: 393216, GPUs: 8, Model: "G2"},
	}
	specs, err := FixedNodes(rows, "hollow", 3, 8, 10)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Name, Model string
		GPUs        int
		CPUMilli    int64
	}
	var got []row
	for _, s := range specs {
		got = append(got, row{s.Name, s.Inventory.GPUs[0].Model, len(s.Inventory.GPUs), s.CPUMilli})
	}
	want := []row{{"hollow-00000", "P100", 8, 64000}, {"hollow-00001", "G2", 8, 96000}, {"hollow-00002", "P100", 8, 64000}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("FixedNodes (-want +got):\n%s", diff)
	}
	if _, err := FixedNodes(rows[1:2], "hollow", 1, 8, 10); err == nil {
		t.Error("FixedNodes without GPU rows: no error")
	}
}

func TestNodeObject(t *testing.T) {
	t.Parallel()
	specs, err := FixedNodes([]simulate.Node{{Name: "x", CPUMilli: 8000, MemoryMiB: 16384, GPUs: 1, Model: "T4"}}, "n", 1, 4, 10)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	node, err := specs[0].node(now)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := node.Status.Allocatable[vgpu.ResourceGPU], int64(40); got.Value() != want {
		t.Errorf("allocatable %s = %s, want %d (splitCount × GPUs)", vgpu.ResourceGPU, got.String(), want)
	}
	if got := node.Status.Allocatable[corev1.ResourcePods]; got.Value() != DefaultMaxPods {
		t.Errorf("allocatable pods = %s, want %d", got.String(), DefaultMaxPods)
	}
	inv, err := vgpu.ParseNodeInventory(node.Annotations[vgpu.AnnotationNodeInventory])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(specs[0].Inventory, inv); diff != "" {
		t.Errorf("inventory annotation (-want +got):\n%s", diff)
	}
	if ready, err := vgpu.ParseReadyLabel(node.Labels[vgpu.LabelGPUReady]); err != nil || !ready {
		t.Errorf("ready label %q: ready %t, err %v", node.Labels[vgpu.LabelGPUReady], ready, err)
	}
	lease, err := specs[0].lease(node, vgpu.DefaultHeartbeatNamespace, now)
	if err != nil {
		t.Fatal(err)
	}
	hb, err := vgpu.ParsePluginHeartbeat(lease.Annotations[vgpu.AnnotationPluginHeartbeat])
	if err != nil || !hb.Registered || hb.Node != "n-00000" {
		t.Errorf("heartbeat %+v, err %v: want registered for n-00000", hb, err)
	}
	if lease.Name != vgpu.HeartbeatLeaseName("n-00000") || lease.Labels[vgpu.LabelHeartbeat] != vgpu.LabelHeartbeatValue {
		t.Errorf("lease %s labels %v: want the heartbeat name and label", lease.Name, lease.Labels)
	}
}

// TestTaskPodAsksWhatTheSimulatorPlaces reads each task's pod back with the extender's own
// readers: the request and constraints must be simulate.PodDemand's.
func TestTaskPodAsksWhatTheSimulatorPlaces(t *testing.T) {
	t.Parallel()
	tasks := map[string]simulate.Task{
		"share":          {Name: "s", CPUMilli: 6000, MemoryMiB: 12288, GPUs: 1, GPUMilli: 460},
		"whole":          {Name: "w", CPUMilli: 12000, MemoryMiB: 16384, GPUs: 1, GPUMilli: 1000},
		"several whole":  {Name: "m", CPUMilli: 32000, MemoryMiB: 65536, GPUs: 4, GPUMilli: 1000},
		"models":         {Name: "v", CPUMilli: 4000, MemoryMiB: 8192, GPUs: 1, GPUMilli: 1000, Models: []string{"V100M16", "V100M32"}},
		"no GPU":         {Name: "c", CPUMilli: 2000, MemoryMiB: 4096},
		"smallest share": {Name: "t", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, GPUMilli: 50},
	}
	for name, task := range tasks {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, err := taskPod("task-00000", task)
			if err != nil {
				t.Fatal(err)
			}
			req, err := vgpu.RequestFromPod(p)
			if err != nil {
				t.Fatal(err)
			}
			c, err := vgpu.ConstraintsFromPod(p)
			if err != nil {
				t.Fatal(err)
			}
			want := simulate.PodDemand(task)
			if diff := cmp.Diff(want.Request, req); diff != "" {
				t.Errorf("request (-simulator +pod):\n%s", diff)
			}
			if diff := cmp.Diff(want.Constraints, c); diff != "" {
				t.Errorf("constraints (-simulator +pod):\n%s", diff)
			}
			cpu, mem := p.Spec.Containers[0].Resources.Requests.Cpu().MilliValue(), p.Spec.Containers[0].Resources.Requests.Memory().Value()>>20
			if cpu != task.CPUMilli || mem != task.MemoryMiB {
				t.Errorf("requests %dm CPU, %d MiB; want %dm, %d MiB", cpu, mem, task.CPUMilli, task.MemoryMiB)
			}
		})
	}
}

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/test/fakecri"
)

// fakeGPUs is the GPU mix of the scenarios' node: 3 GPUs, so 30 devices at the default split count.
const (
	fakeGPUs     = "2xA100-80GB,1xT4-16GB"
	wantDevices  = 3 * 10
	registerTime = 10 * time.Second
)

// gpuCounts returns the Node's hami.io/gpu capacity and allocatable and its ready label.
func gpuCounts(ctx context.Context, c *cluster.Cluster, name string) (capacity, allocatable int64, ready string, err error) {
	node, err := c.Client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, 0, "", err
	}
	capQ, allocQ := node.Status.Capacity[cluster.ResourceGPU], node.Status.Allocatable[cluster.ResourceGPU]
	return capQ.Value(), allocQ.Value(), node.Labels[cluster.LabelGPUReady], nil
}

// TestPluginRegistersAndRunsWholeGPUPod is scenario 1. Real: etcd, kube-apiserver, kube-scheduler,
// kubelet, gpuslice-device-plugin. Fake: NVML (--fake-gpus) and the container runtime (records
// CreateContainer).
func TestPluginRegistersAndRunsWholeGPUPod(t *testing.T) {
	c := startCluster(t, cluster.NodeOptions{Name: "node-1", FakeGPUs: fakeGPUs, NoPlugin: true})
	n := c.Nodes[0]
	ctx := context.Background()

	began := time.Now()
	if err := n.StartPlugin(); err != nil {
		t.Fatal(err)
	}
	poll(t, registerTime, "capacity and allocatable = GPUs × splitCount, label ready", func(ctx context.Context) (bool, string) {
		capacity, allocatable, ready, err := gpuCounts(ctx, c, n.Name)
		seen := fmt.Sprintf("capacity %d, allocatable %d, %s=%q, err %v", capacity, allocatable, cluster.LabelGPUReady, ready, err)
		return capacity == wantDevices && allocatable == wantDevices && ready == "true", seen
	})
	t.Logf("registered: capacity and allocatable %d, ready label, %v after the plugin started", wantDevices, time.Since(began).Round(time.Millisecond))

	_, inv, err := c.NodeInventory(ctx, n.Name)
	if err != nil {
		t.Fatal(err)
	}
	uuids := map[string]bool{}
	for _, g := range inv.GPUs {
		uuids[g.UUID] = true
	}
	if len(uuids) != 3 {
		t.Fatalf("inventory has %d GPUs, want 3: %+v", len(uuids), inv.GPUs)
	}

	pod, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, gpuPod("whole-gpu", 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "pod whole-gpu Running", func(ctx context.Context) (bool, string) {
		p, err := c.Client().CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, fmt.Sprintf("phase %s on %q, conditions %+v", p.Status.Phase, p.Spec.NodeName, p.Status.Conditions)
	})

	rec := findRecord(t, n, pod.Name, "main")
	got := rec.Env["NVIDIA_VISIBLE_DEVICES"]
	if !uuids[got] {
		t.Errorf("CreateContainer env NVIDIA_VISIBLE_DEVICES = %q, want one of the node's GPU UUIDs %v (record %+v)", got, uuids, rec)
	}
}

// findRecord returns the latest CreateContainer record of pod's container on n, failing t when
// there is none.
func findRecord(t *testing.T, n *cluster.Node, pod, container string) fakecri.Record {
	t.Helper()
	records, err := n.CRIRecords()
	if err != nil {
		t.Fatal(err)
	}
	for i := len(records) - 1; i >= 0; i-- {
		if r := records[i]; r.Pod == pod && r.Container == container {
			return r
		}
	}
	t.Fatalf("no CreateContainer record for %s/%s on %s among %d records", pod, container, n.Name, len(records))
	return fakecri.Record{}
}

// TestPluginKilledAndRestarted is scenario 3: a killed plugin takes allocatable to 0 at once while
// capacity stays (the kubelet's grace period); a new plugin restores both. Real: every Kubernetes
// component and gpuslice-device-plugin. Fake: NVML and the container runtime.
func TestPluginKilledAndRestarted(t *testing.T) {
	c := startCluster(t, cluster.NodeOptions{Name: "node-1", FakeGPUs: fakeGPUs})
	n := c.Nodes[0]

	if err := n.KillPlugin(); err != nil {
		t.Fatal(err)
	}
	poll(t, registerTime, "allocatable 0 and capacity kept after the plugin is killed", func(ctx context.Context) (bool, string) {
		capacity, allocatable, ready, err := gpuCounts(ctx, c, n.Name)
		return capacity == wantDevices && allocatable == 0, fmt.Sprintf("capacity %d, allocatable %d, ready %q, err %v", capacity, allocatable, ready, err)
	})

	if err := n.StartPlugin(); err != nil {
		t.Fatal(err)
	}
	poll(t, registerTime, "allocatable restored and ready label after the plugin restarts", func(ctx context.Context) (bool, string) {
		capacity, allocatable, ready, err := gpuCounts(ctx, c, n.Name)
		return capacity == wantDevices && allocatable == wantDevices && ready == "true", fmt.Sprintf("capacity %d, allocatable %d, ready %q, err %v", capacity, allocatable, ready, err)
	})
}

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/node/kubeletstate"
	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// runGPUPod creates a one-GPU pod and waits for it to run, returning it.
func runGPUPod(t *testing.T, c *cluster.Cluster, name string) *corev1.Pod {
	t.Helper()
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	if _, err := pods.Create(context.Background(), gpuPod(name, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return waitRunningOn(t, c, name, "")
}

// checkpointDevices returns the device IDs the kubelet's device-manager checkpoint holds for pod's
// container, sorted.
func checkpointDevices(t *testing.T, n *cluster.Node, podUID, container string) []string {
	t.Helper()
	entries, err := kubeletstate.Read(n.DevicePluginDir())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		if e.PodUID == podUID && e.Container == container && e.Resource == string(cluster.ResourceGPU) {
			ids = append(ids, e.DeviceIDs...)
		}
	}
	slices.Sort(ids)
	return ids
}

// TestKubeletRestart is scenario 2: after a kubelet restart the plugin registers again, capacity
// and allocatable return, and a running pod keeps its devices (same IDs in the checkpoint), its
// env and its Running phase. Real: every Kubernetes component and gpuslice-device-plugin. Fake:
// NVML and the container runtime.
func TestKubeletRestart(t *testing.T) {
	c := startCluster(t, cluster.NodeOptions{Name: "node-1", FakeGPUs: fakeGPUs})
	n := c.Nodes[0]
	pod := runGPUPod(t, c, "survivor")
	idsBefore := checkpointDevices(t, n, string(pod.UID), "main")
	envBefore := findRecord(t, n, pod.Name, "main").Env["NVIDIA_VISIBLE_DEVICES"]
	if len(idsBefore) != 1 {
		t.Fatalf("checkpoint devices of the pod before restart = %v, want 1", idsBefore)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Whether the Node ever shows capacity 0 depends on whether the restarted kubelet posts its
	// status before the plugin has registered again (milliseconds): logged, not asserted.
	watcher, err := c.Client().CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + n.Name})
	if err != nil {
		t.Fatal(err)
	}
	sawZero := make(chan bool, 1)
	go func() {
		zero := false
		for ev := range watcher.ResultChan() {
			if node, ok := ev.Object.(*corev1.Node); ok {
				q := node.Status.Capacity[cluster.ResourceGPU]
				zero = zero || q.IsZero()
			}
		}
		sawZero <- zero
	}()
	if err := n.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := n.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	poll(t, registerTime, "plugin registered again after the kubelet restart", func(ctx context.Context) (bool, string) {
		capacity, allocatable, ready, err := gpuCounts(ctx, c, n.Name)
		return capacity == wantDevices && allocatable == wantDevices && ready == "true", fmt.Sprintf("capacity %d, allocatable %d, ready %q, err %v", capacity, allocatable, ready, err)
	})
	watcher.Stop()
	t.Logf("kubelet Ready and plugin registered again %v after the kubelet restarted (capacity 0 seen in between: %v)", time.Since(began).Round(time.Millisecond), <-sawZero)
	if log := n.Plugin.LogTail(200); strings.Count(log, `"Registered with kubelet"`) < 2 {
		t.Errorf("the plugin's log shows no second registration:\n%s", log)
	}

	if idsAfter := checkpointDevices(t, n, string(pod.UID), "main"); !slices.Equal(idsBefore, idsAfter) {
		t.Errorf("checkpoint devices of the pod: before restart %v, after %v", idsBefore, idsAfter)
	}
	p, err := c.Client().CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning {
		t.Errorf("pod phase after the kubelet restart = %s, want Running", p.Status.Phase)
	}
	if got := findRecord(t, n, pod.Name, "main").Env["NVIDIA_VISIBLE_DEVICES"]; got != envBefore {
		t.Errorf("NVIDIA_VISIBLE_DEVICES of the latest CreateContainer: before restart %q, after %q", envBefore, got)
	}
}

// TestKubeletRestartWithPluginDown is the visible half of scenario 2: with the plugin stopped
// (SIGTERM, so it clears its ready label), a restarted kubelet reports hami.io/gpu capacity 0 (with
// the plugin alive it re-registers before the kubelet's first status post, so TestKubeletRestart
// cannot see the 0); a plugin started afterwards brings capacity back. Real: every Kubernetes
// component and gpuslice-device-plugin. Fake: NVML and the container runtime.
func TestKubeletRestartWithPluginDown(t *testing.T) {
	c := startCluster(t, cluster.NodeOptions{Name: "node-1", FakeGPUs: fakeGPUs})
	n := c.Nodes[0]
	if err := n.StopPlugin(); err != nil {
		t.Fatal(err)
	}
	poll(t, registerTime, "ready label false after the plugin stopped", func(ctx context.Context) (bool, string) {
		_, _, ready, err := gpuCounts(ctx, c, n.Name)
		return ready == "false", fmt.Sprintf("ready %q, err %v", ready, err)
	})
	if err := n.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := n.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	poll(t, registerTime, "capacity and allocatable 0 after the kubelet restarted without a plugin", func(ctx context.Context) (bool, string) {
		capacity, allocatable, ready, err := gpuCounts(ctx, c, n.Name)
		return capacity == 0 && allocatable == 0, fmt.Sprintf("capacity %d, allocatable %d, ready %q, err %v", capacity, allocatable, ready, err)
	})
	if err := n.StartPlugin(); err != nil {
		t.Fatal(err)
	}
	poll(t, registerTime, "capacity, allocatable and ready label back once the plugin registers", func(ctx context.Context) (bool, string) {
		capacity, allocatable, ready, err := gpuCounts(ctx, c, n.Name)
		return capacity == wantDevices && allocatable == wantDevices && ready == "true", fmt.Sprintf("capacity %d, allocatable %d, ready %q, err %v", capacity, allocatable, ready, err)
	})
}

// TestContainerRestartKeepsDevices is scenario 5: a container that exits is restarted with the
// same devices and env (the kubelet replays the cached Allocate response). The test stops the
// container through the fake runtime's CRI socket, as if its process had exited. On the same
// cluster, a pod deleted and created again under its name while the plugin's view lags gets its
// own slice (recreatedPodGetsItsOwnSlice). Real: every Kubernetes component and
// gpuslice-device-plugin. Fake: NVML and the container runtime.
func TestContainerRestartKeepsDevices(t *testing.T) {
	c := startCluster(t, cluster.NodeOptions{Name: "node-1", FakeGPUs: fakeGPUs})
	n := c.Nodes[0]
	pod := runGPUPod(t, c, "restarter")
	first := findRecord(t, n, pod.Name, "main")

	conn, err := grpc.NewClient("unix://"+filepath.Join(n.Dir, "cri.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cri := runtimeapi.NewRuntimeServiceClient(conn)
	ctx := context.Background()
	list, err := cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(pod.UID)},
	}})
	if err != nil || len(list.GetContainers()) != 1 {
		t.Fatalf("list the pod's containers in the fake runtime: %v, %d containers", err, len(list.GetContainers()))
	}
	if _, err := cri.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: list.GetContainers()[0].GetId()}); err != nil {
		t.Fatalf("stop the container in the fake runtime: %v", err)
	}

	poll(t, time.Minute, "container restarted (restartCount 1, a CreateContainer with attempt 1)", func(ctx context.Context) (bool, string) {
		p, err := c.Client().CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		restarts := int32(-1)
		if len(p.Status.ContainerStatuses) == 1 {
			restarts = p.Status.ContainerStatuses[0].RestartCount
		}
		r := findRecord(t, n, pod.Name, "main")
		return restarts >= 1 && r.Attempt >= 1, fmt.Sprintf("restartCount %d, latest attempt %d", restarts, r.Attempt)
	})
	second := findRecord(t, n, pod.Name, "main")
	if second.Env["NVIDIA_VISIBLE_DEVICES"] != first.Env["NVIDIA_VISIBLE_DEVICES"] || second.Env["NVIDIA_VISIBLE_DEVICES"] == "" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES: attempt 0 %q, attempt %d %q; want the same GPU", first.Env["NVIDIA_VISIBLE_DEVICES"], second.Attempt, second.Env["NVIDIA_VISIBLE_DEVICES"])
	}
	if !slices.Equal(first.CDIDevices, second.CDIDevices) || len(first.Devices) != len(second.Devices) {
		t.Errorf("devices differ between attempts: %+v vs %+v", first, second)
	}

	t.Run("pod created again under its name while the plugin's view lags", func(t *testing.T) {
		recreatedPodGetsItsOwnSlice(t, c, n)
	})
}

// TestNodeWithoutPluginGetsNoGPUPod is scenario 4 (and proof 3 of the scheduling issue): a Ready
// node whose plugin has not started has no hami.io/gpu and no ready label, so a GPU pod stays
// Pending with a FailedScheduling event saying "plugin not ready" (the extender's barrier); once
// the plugin registers, the pod is bound there and runs. After a plugin crash (allocatable 0) no
// new pod is bound there. Real: every Kubernetes component and gpuslice's binaries. Fake: NVML and
// the container runtime.
func TestNodeWithoutPluginGetsNoGPUPod(t *testing.T) {
	c := startCluster(t, cluster.NodeOptions{Name: "node-1", FakeGPUs: fakeGPUs, NoPlugin: true})
	n := c.Nodes[0]
	ctx := context.Background()
	node, err := c.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := node.Labels[cluster.LabelGPUReady]; v == "true" {
		t.Errorf("label %s = %q before the plugin started", cluster.LabelGPUReady, v)
	}
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	if _, err := pods.Create(ctx, gpuPod("waiter", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPendingWith(t, c, "waiter", "plugin not ready")

	if err := n.StartPlugin(); err != nil {
		t.Fatal(err)
	}
	running := waitRunningOn(t, c, "waiter", n.Name)
	// Whether kube-scheduler retried on its own or the extender had to ask (it saw the plugin
	// turn ready after kube-scheduler's own retry had been turned away).
	t.Logf("%s: %q", extender.AnnotationRetry, running.Annotations[extender.AnnotationRetry])

	if err := n.KillPlugin(); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "allocatable hami.io/gpu 0 after the plugin crash", func(ctx context.Context) (bool, string) {
		_, alloc, _, err := gpuCounts(ctx, c, n.Name)
		if err != nil {
			return false, err.Error()
		}
		return alloc == 0, fmt.Sprintf("allocatable %d", alloc)
	})
	if _, err := pods.Create(ctx, slicePod("late", 8192, 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPendingWith(t, c, "late", "plugin not ready")
}

// waitRunningOn waits up to a minute for pod name (default namespace) to be bound to node (any
// node when "") and Running, and returns it.
func waitRunningOn(t *testing.T, c *cluster.Cluster, name, node string) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	poll(t, time.Minute, name+" Running on "+cmp.Or(node, "any node"), func(ctx context.Context) (bool, string) {
		p, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		last = p
		return (node == "" || p.Spec.NodeName == node) && p.Status.Phase == corev1.PodRunning, fmt.Sprintf("node %q, phase %s", p.Spec.NodeName, p.Status.Phase)
	})
	return last
}

// TestHeartbeatBackRetriesPod proves the extender's retry request with the real kube-scheduler. The
// node's plugin is frozen (SIGSTOP): it stays registered and its label and allocatable stay, but
// its heartbeat Lease ages, so a GPU pod is turned away with "heartbeat Lease not renewed". When
// the plugin runs again only the Lease changes, and kube-scheduler does not watch Leases: without
// the extender's gpuslice.io/scheduler-retry the pod would wait for kube-scheduler's five-minute
// flush of unschedulable pods. Real: every Kubernetes component and gpuslice's binaries. Fake:
// NVML and the container runtime.
func TestHeartbeatBackRetriesPod(t *testing.T) {
	opts := clusterOptions(cluster.NodeOptions{Name: "node-1", FakeGPUs: fakeGPUs, PluginArgs: []string{"--lease-renew=1s"}})
	opts.ExtenderArgs = []string{"--heartbeat-max-age=3s"}
	c := startClusterWith(t, opts)
	n := c.Nodes[0]
	ctx := context.Background()
	if err := n.PausePlugin(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.ResumePlugin) // before the cluster stops it
	leases := c.Client().CoordinationV1().Leases(vgpu.DefaultHeartbeatNamespace)
	poll(t, 30*time.Second, "the heartbeat Lease older than the extender's 3 s", func(ctx context.Context) (bool, string) {
		l, err := leases.Get(ctx, vgpu.HeartbeatLeaseName(n.Name), metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if l.Spec.RenewTime == nil {
			return false, "no renewTime"
		}
		age := time.Since(l.Spec.RenewTime.Time)
		return age > 4*time.Second, fmt.Sprintf("renewed %v ago", age)
	})
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	if _, err := pods.Create(ctx, gpuPod("frozen", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPendingWith(t, c, "frozen", "heartbeat Lease not renewed")

	n.ResumePlugin()
	resumed := time.Now()
	p := waitRunningOn(t, c, "frozen", n.Name)
	if p.Annotations[extender.AnnotationRetry] == "" {
		t.Errorf("pod Running without %s: kube-scheduler retried on some other event", extender.AnnotationRetry)
	}
	t.Logf("Running %v after the plugin resumed; %s: %q", time.Since(resumed).Round(100*time.Millisecond), extender.AnnotationRetry, p.Annotations[extender.AnnotationRetry])
}

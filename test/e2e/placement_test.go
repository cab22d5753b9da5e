package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// withGPUs sets c's limits to gpus GPUs of memMiB MiB each (memMiB 0: whole GPUs).
func withGPUs(c *corev1.Container, gpus, memMiB int64) {
	limits := corev1.ResourceList{vgpu.ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}
	if memMiB > 0 {
		limits[vgpu.ResourceMemory] = *resource.NewQuantity(memMiB, resource.DecimalSI)
	}
	c.Resources = corev1.ResourceRequirements{Limits: limits}
}

// TestPlacementShapes is proof 4: mixed models on one node steered by hami.io/gpu-model,
// multi-GPU containers, multi-container pods, a sidecar (restartable init) container with a GPU
// slice, whole-GPU pods beside shared ones; regular init containers asking for GPUs are refused
// by the webhook with a message that suggests a sidecar. Every running container's environment
// equals its own allocation.
func TestPlacementShapes(t *testing.T) {
	c := startCluster(t, cluster.NodeOptions{Name: "node-1", FakeGPUs: "2xA100-80GB,2xT4-16GB"})
	ctx := context.Background()
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)

	t4 := slicePod("on-t4", 4096, 0)
	t4.Annotations = map[string]string{vgpu.AnnotationGPUModel: "T4"}
	a100 := slicePod("on-a100", 20480, 0)
	a100.Annotations = map[string]string{vgpu.AnnotationGPUModel: "A100"}
	multiGPU := slicePod("two-gpus", 0, 0)
	withGPUs(&multiGPU.Spec.Containers[0], 2, 8192)
	multiGPU.Annotations = map[string]string{vgpu.AnnotationGPUModel: "A100"}
	twoContainers := slicePod("two-containers", 2048, 0)
	second := *twoContainers.Spec.Containers[0].DeepCopy()
	second.Name = "helper"
	withGPUs(&second, 1, 1024)
	twoContainers.Spec.Containers = append(twoContainers.Spec.Containers, second)
	always := corev1.ContainerRestartPolicyAlways
	sidecar := slicePod("with-sidecar", 2048, 0)
	side := *sidecar.Spec.Containers[0].DeepCopy()
	side.Name = "sidecar"
	side.RestartPolicy = &always
	withGPUs(&side, 1, 1024)
	sidecar.Spec.InitContainers = []corev1.Container{side}
	whole := slicePod("whole-gpu", 0, 0)
	withGPUs(&whole.Spec.Containers[0], 1, 0)
	whole.Annotations = map[string]string{vgpu.AnnotationGPUModel: "T4"}
	all := []*corev1.Pod{t4, a100, multiGPU, twoContainers, sidecar, whole}
	createAll(t, c, all)

	out := waitSettled(t, c, "", len(all), 2*time.Minute)
	if len(out.pending) > 0 {
		failed, _ := failedScheduling(ctx, c)
		for _, p := range out.pending {
			t.Errorf("%s Pending: %s", p.Name, failed[p.UID])
		}
	}
	for _, b := range append(checkExact(t, c, out.running), checkCapacity(t, c, out.running)...) {
		t.Error(b)
	}
	_, inv, err := c.NodeInventory(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	model := map[string]string{}
	for _, g := range inv.GPUs {
		model[g.UUID] = g.Model
	}
	byName := map[string]vgpu.PodAllocation{}
	for _, p := range out.running {
		a, err := vgpu.ParsePodAllocation(p.Annotations[vgpu.AnnotationPodAllocation])
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		byName[p.Name] = a
	}
	expect := []struct {
		pod, container, model string
		gpus                  int
	}{
		{"on-t4", "main", "T4", 1},
		{"on-a100", "main", "A100", 1},
		{"two-gpus", "main", "A100", 2},
		{"two-containers", "main", "", 1},
		{"two-containers", "helper", "", 1},
		{"with-sidecar", "sidecar", "", 1},
		{"with-sidecar", "main", "", 1},
		{"whole-gpu", "main", "T4", 1},
	}
	for _, e := range expect {
		ca, ok := byName[e.pod].Container(e.container)
		if !ok {
			t.Errorf("%s/%s: no allocation", e.pod, e.container)
			continue
		}
		if len(ca.GPUs) != e.gpus {
			t.Errorf("%s/%s: %d GPUs, want %d", e.pod, e.container, len(ca.GPUs), e.gpus)
		}
		for _, s := range ca.GPUs {
			if e.model != "" && !strings.Contains(model[s.UUID], e.model) {
				t.Errorf("%s/%s: GPU %s is %q, want model %s", e.pod, e.container, s.UUID, model[s.UUID], e.model)
			}
		}
	}
	// The whole-GPU pod's T4 holds no other slice.
	if ca, ok := byName["whole-gpu"].Container("main"); ok && len(ca.GPUs) == 1 {
		for name, a := range byName {
			for _, other := range a.Containers {
				for _, s := range other.GPUs {
					if name != "whole-gpu" && s.UUID == ca.GPUs[0].UUID {
						t.Errorf("%s/%s shares the whole-GPU pod's GPU %s", name, other.Name, s.UUID)
					}
				}
			}
		}
	}

	initPod := slicePod("gpu-in-init", 2048, 0)
	initC := *initPod.Spec.Containers[0].DeepCopy()
	initC.Name = "setup"
	initPod.Spec.InitContainers = []corev1.Container{initC}
	_, err = pods.Create(ctx, initPod, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "sidecar") {
		t.Errorf("creating a pod with a GPU in a regular init container: err = %v; want a rejection that suggests a sidecar", err)
	}
}

// TestRestartsDuringBurst is proof 5: pods keep arriving while the extender restarts, the plugin
// is killed and started again, and the kubelet restarts. Each outage is visible to the extender
// (the plugin's ready label or the node's allocatable) before the next pods arrive, so pods that
// arrive during an outage wait Pending instead of failing admission; afterwards every pod is
// Running with exactly its own slice, none is Failed, and no GPU holds more than it has. Pods
// already bound when the plugin crashes or the kubelet stops are let land first: the kubelet
// would fail their admission whatever the plugin does (see docs/architecture.md).
func TestRestartsDuringBurst(t *testing.T) {
	c := startCluster(t, cluster.NodeOptions{Name: "node-1", FakeGPUs: "4xA100-80GB", PluginArgs: []string{"--split-count=8"}})
	n := c.Nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var pods []*corev1.Pod
	for i := range 40 {
		pods = append(pods, slicePod(fmt.Sprintf("burst-%02d", i), int64(4096+1024*(i%5)), 10))
	}
	nodeState := func(want string, ok func(ready string, allocatable int64) bool) {
		t.Helper()
		poll(t, 30*time.Second, "node-1 "+want, func(ctx context.Context) (bool, string) {
			_, alloc, ready, err := gpuCounts(ctx, c, n.Name)
			if err != nil {
				return false, err.Error()
			}
			return ok(ready, alloc), fmt.Sprintf("label %q, allocatable %d", ready, alloc)
		})
	}

	// The extender restarts while the first pods wait to be scheduled.
	createAll(t, c, pods[:10])
	if err := c.RestartExtender(ctx); err != nil {
		t.Fatal(err)
	}
	createAll(t, c, pods[10:20])
	// Pods bound just before a plugin crash and admitted just after it fail admission in
	// any kubelet (FIELD.md §1): let the first 20 land before the crash.
	waitSettled(t, c, "burst-", 20, 2*time.Minute)

	// The plugin crashes: the kubelet drops allocatable to 0, new pods wait.
	if err := n.KillPlugin(); err != nil {
		t.Fatal(err)
	}
	nodeState("allocatable 0 after the plugin crash", func(_ string, a int64) bool { return a == 0 })
	createAll(t, c, pods[20:30])
	if err := n.StartPlugin(); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitPluginReady(ctx); err != nil {
		t.Fatal(err)
	}
	// Likewise, a kubelet re-admits at start the pods bound while it was up but not yet
	// admitted, before the plugin is back: let these land first.
	waitSettled(t, c, "burst-", 30, 2*time.Minute)

	// The kubelet restarts: the plugin sees its ListAndWatch stream end and lowers the label.
	if err := n.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	nodeState("ready label false while the kubelet is down", func(r string, _ int64) bool { return r == "false" })
	createAll(t, c, pods[30:])
	if err := n.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitPluginReady(ctx); err != nil {
		t.Fatal(err)
	}

	out := waitSettled(t, c, "burst-", len(pods), 3*time.Minute)
	for _, b := range append(checkExact(t, c, out.running), checkCapacity(t, c, out.running)...) {
		t.Error(b)
	}
	t.Logf("after restarts: %d Running, %d Pending", len(out.running), len(out.pending))
	// 4 GPUs x 8 slices = 32 slices; 40 pods of 4-8 GiB fit in memory, so slices are the limit.
	if len(out.running) != 32 {
		failed, _ := failedScheduling(ctx, c)
		for _, p := range out.pending {
			t.Logf("%s Pending: %s", p.Name, failed[p.UID])
		}
		t.Errorf("%d pods Running; want 32 (every slice of the node used once)", len(out.running))
	}
}

// TestForgedAndGarbageInput is proof 6: a pod that sets its own allocation annotation is rejected
// by the API server (through the webhook), and garbage sent to every extender and webhook endpoint
// gets a 4xx answer, not a crash. Then, with the webhook stopped, only GPU pods are refused.
func TestForgedAndGarbageInput(t *testing.T) {
	c := startCluster(t, cluster.NodeOptions{Name: "node-1", FakeGPUs: "2xA100-80GB"})
	ctx := context.Background()
	forged := slicePod("forged", 1024, 0)
	forged.Annotations = map[string]string{vgpu.AnnotationPodAllocation: `{"version":"v1","node":"node-1","containers":[{"name":"main","gpus":[{"uuid":"GPU-x","memoryMiB":81920}]}]}`}
	_, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, forged, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), vgpu.AnnotationPodAllocation) {
		t.Errorf("creating a pod with a forged allocation: err = %v; want a rejection naming %s", err, vgpu.AnnotationPodAllocation)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.State.WebhookCA)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	urls := []string{c.ExtenderURL() + "/filter", c.ExtenderURL() + "/prioritize", c.ExtenderURL() + "/bind", c.WebhookURL() + "/mutate"}
	bodies := []string{"", "{", "not json", `{"Pod":null}`, `[1,2,3]`, strings.Repeat("[", 10000)}
	for _, url := range urls {
		for _, body := range bodies {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("POST %s %.20q: %v", url, body, err)
				continue
			}
			_ = resp.Body.Close()
			if resp.StatusCode < 400 || resp.StatusCode > 499 {
				t.Errorf("POST %s %.20q: HTTP %d, want 4xx", url, body, resp.StatusCode)
			}
		}
	}
	// Both still serve.
	for _, url := range []string{c.ExtenderURL() + "/healthz", c.WebhookURL() + "/healthz"} {
		resp, err := client.Get(url) //nolint:noctx // a one-off probe with the client's timeout
		if err != nil {
			t.Errorf("GET %s after garbage: %v", url, err)
			continue
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s after garbage: HTTP %d", url, resp.StatusCode)
		}
	}
	checkRecreatedSameName(ctx, t, c)
	checkBypassingPod(ctx, t, c)
	checkWebhookDown(ctx, t, c)
}

// checkRecreatedSameName plays a StatefulSet recreating web-0 on the same node: it deletes the
// pod, waits until the API server has removed it (as the StatefulSet controller does) and creates
// it again at once, alternately on each GPU (a 50 GiB pod fills most of GPU 0, so a 30 GiB web-0
// fits there and a 40 GiB one only on GPU 1). The plugin knows the new container only by
// namespace and name while its view may still show the old pod; every incarnation must run with
// its own allocation, never the one before it.
func checkRecreatedSameName(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	if _, err := pods.Create(ctx, slicePod("fill", 50*1024, 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunningOn(t, c, "fill", "node-1")
	var gpus []string
	for i, memMiB := range []int64{30 * 1024, 40 * 1024, 30 * 1024, 40 * 1024} {
		if i > 0 {
			if err := pods.Delete(ctx, "web-0", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			poll(t, time.Minute, "web-0 removed", func(ctx context.Context) (bool, string) {
				_, err := pods.Get(ctx, "web-0", metav1.GetOptions{})
				return apierrors.IsNotFound(err), fmt.Sprint(err)
			})
		}
		if _, err := pods.Create(ctx, slicePod("web-0", memMiB, 0), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := waitRunningOn(t, c, "web-0", "node-1")
		if bad := checkExact(t, c, []corev1.Pod{*p}); len(bad) > 0 {
			t.Errorf("web-0 incarnation %d (%d MiB) did not get its own slice:\n%s", i+1, memMiB, strings.Join(bad, "\n"))
		}
		alloc, err := vgpu.ParsePodAllocation(p.Annotations[vgpu.AnnotationPodAllocation])
		if err == nil && len(alloc.Containers) == 1 && len(alloc.Containers[0].GPUs) == 1 {
			gpus = append(gpus, alloc.Containers[0].GPUs[0].UUID)
		}
	}
	if len(gpus) == 4 && (gpus[0] == gpus[1] || gpus[0] != gpus[2]) {
		t.Errorf("web-0's GPUs by incarnation = %v, want them to alternate", gpus)
	}
	for _, name := range []string{"web-0", "fill"} {
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// checkBypassingPod creates GPU pods with spec.nodeName set, which the scheduler never sees and
// so never get an allocation: the webhook rejects one, and one created where the webhook is not
// called (kube-system) is rejected by the kubelet at admission, because the plugin's Allocate
// refuses its devices, and ends Failed with the reason; a pod bound by the scheduler then runs.
func checkBypassingPod(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	bypass := gpuPod("bypass", 1)
	bypass.Spec.NodeName = "node-1"
	_, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, bypass, metav1.CreateOptions{})
	if want := `spec.nodeName="node-1": must be empty for a pod that asks for hami.io resources`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("create a GPU pod with spec.nodeName set: err = %v, want a denial containing %q", err, want)
	}
	bypass.Namespace = metav1.NamespaceSystem
	system := c.Client().CoreV1().Pods(metav1.NamespaceSystem)
	if _, err := system.Create(ctx, bypass, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create a GPU pod with spec.nodeName set in %s: %v", metav1.NamespaceSystem, err)
	}
	const want = "a pod created with spec.nodeName set bypasses it"
	poll(t, time.Minute, "the bypassing pod Failed at admission", func(ctx context.Context) (bool, string) {
		p, err := system.Get(ctx, bypass.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodFailed && strings.Contains(p.Status.Message, want), fmt.Sprintf("phase %s reason %q message %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
	})
	if _, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, slicePod("after-bypass", 1024, 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunningOn(t, c, "after-bypass", "node-1")
}

// checkWebhookDown stops the webhook: a pod that asks for no hami.io resource and carries no
// hami.io annotation is still created (the webhook's matchConditions keep it away), while a GPU
// pod is refused (failurePolicy Fail) with a message that names the webhook.
func checkWebhookDown(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	if err := c.StopWebhook(); err != nil {
		t.Fatal(err)
	}
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	plain := slicePod("plain-webhook-down", 1024, 0)
	plain.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	if _, err := pods.Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Errorf("create a plain pod with the webhook down: %v, want it created", err)
	}
	_, err := pods.Create(ctx, slicePod("gpu-webhook-down", 1024, 0), metav1.CreateOptions{})
	if want := `failed calling webhook "pods.gpuslice.io"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("create a GPU pod with the webhook down: err = %v, want a refusal containing %q", err, want)
	}
}

// TestExtenderRestartOnFullNodeGivesNoSliceTwice restarts the extender alone (kube-scheduler keeps
// running) three times while pods keep arriving for a node whose slices are all taken. A restarted
// extender that answered before its informers had counted the bound pods would see every GPU free
// and bind a second pod onto a taken slice; the extender instead turns every node away ("informer
// caches not synced") and refuses to bind until it has synced. Afterwards exactly the first pods
// run, every later one is Pending for want of a free slice, and no GPU holds more than it has.
func TestExtenderRestartOnFullNodeGivesNoSliceTwice(t *testing.T) {
	c := startCluster(t, cluster.NodeOptions{Name: "node-1", FakeGPUs: "2xA100-80GB", PluginArgs: []string{"--split-count=4"}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var first []*corev1.Pod
	for i := range 8 {
		first = append(first, slicePod(fmt.Sprintf("full-%02d", i), 4096, 10))
	}
	createAll(t, c, first)
	if out := waitSettled(t, c, "full-", len(first), 2*time.Minute); len(out.running) != len(first) {
		t.Fatalf("%d of %d pods Running before the restarts; want all (2 GPUs x 4 slices)", len(out.running), len(first))
	}
	total := len(first)
	for round := range 3 {
		var more []*corev1.Pod
		for i := range 6 {
			more = append(more, slicePod(fmt.Sprintf("full-r%d-%d", round, i), 4096, 10))
		}
		createAll(t, c, more)
		total += len(more)
		if err := c.RestartExtender(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Pods turned away before the restarted extender synced are retried once it has; wait until
	// every Pending pod's latest verdict is about slices, not about the restart.
	poll(t, 2*time.Minute, "every pod Running or turned away for want of a free slice", func(ctx context.Context) (bool, string) {
		list, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		failed, err := failedScheduling(ctx, c)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range list.Items {
			running := p.Status.Phase == corev1.PodRunning
			if strings.HasPrefix(p.Name, "full-") && !running && (p.Spec.NodeName != "" || !strings.Contains(failed[p.UID], "no free slice")) {
				return false, p.Name + ": " + failed[p.UID]
			}
		}
		return true, ""
	})
	out := waitSettled(t, c, "full-", total, time.Minute)
	for _, b := range checkCapacity(t, c, out.running) {
		t.Error(b)
	}
	if len(out.running) != len(first) {
		t.Errorf("%d pods Running after the restarts, want %d: a slice was given twice", len(out.running), len(first))
	}
	t.Logf("after 3 extender restarts: %d Running, %d Pending", len(out.running), len(out.pending))
}

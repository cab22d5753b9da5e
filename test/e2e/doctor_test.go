package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// doctorValues run the chart's plugin with two fake T4s on nodes labelled gpuslice.io/test-gpu.
const doctorValues = `devicePlugin:
  fakeGPUs: 2xT4-16GB
  nodeSelector:
    nvidia.com/gpu.present: null
    gpuslice.io/test-gpu: "true"
image:
  repository: gpuslice.example/gpuslice
  tag: test
scheduler:
  kubeScheduler:
    tag: v1.37.2
`

// check is one line of gpuslice doctor -o json.
type check struct {
	Node    string `json:"node"`
	Name    string `json:"name"`
	Result  string `json:"result"`
	Message string `json:"message"`
	Fix     string `json:"fix"`
}

// cli runs the gpuslice binary against c and returns its standard output and exit code.
func cli(t *testing.T, c *cluster.Cluster, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "gpuslice"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.State.Kubeconfig)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return stdout.String(), exit.ExitCode()
	case err != nil:
		t.Fatalf("gpuslice %v: %v", args, err)
	}
	if stderr.Len() > 0 {
		t.Logf("gpuslice %v stderr: %s", args, stderr.String())
	}
	return stdout.String(), 0
}

// doctor runs gpuslice doctor -o json with args and returns its checks and exit code.
func doctor(t *testing.T, c *cluster.Cluster, args ...string) ([]check, int) {
	t.Helper()
	out, code := cli(t, c, append([]string{"doctor", "-o", "json"}, args...)...)
	var r struct{ Checks []check }
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("gpuslice doctor -o json (exit %d): %v\n%s", code, err, out)
	}
	return r.Checks, code
}

// find returns the check named name of node ("" for a cluster check).
func find(checks []check, node, name string) (check, bool) {
	for _, c := range checks {
		if c.Node == node && c.Name == name {
			return c, true
		}
	}
	return check{}, false
}

// waitCheck polls doctor until check name of node has result with a message and a fix containing
// the given strings, and returns it.
func waitCheck(t *testing.T, c *cluster.Cluster, node, name, result, message, fix string) check {
	t.Helper()
	var got check
	poll(t, time.Minute, fmt.Sprintf("doctor %s %s %s %q", node, name, result, message), func(context.Context) (bool, string) {
		checks, code := doctor(t, c)
		got, _ = find(checks, node, name)
		ok := got.Result == result && strings.Contains(got.Message, message) && strings.Contains(got.Fix, fix)
		if ok && result == "FAIL" && code != 1 {
			t.Fatalf("doctor exit code %d with a FAIL, want 1", code)
		}
		return ok, fmt.Sprintf("%+v (exit %d)", got, code)
	})
	t.Logf("%s %s: %s %s (fix: %s)", node, name, got.Result, got.Message, got.Fix)
	return got
}

// TestDoctorFindsEachBreak is kubectl gpuslice doctor on the local cluster, installed with the
// chart: every check passes on a healthy node, then each thing is broken in turn — a device plugin
// watching the wrong device-plugin folder, the ready label removed, a stale heartbeat, the
// extender down, the plugin stopped, the webhook down — and doctor reports that FAIL with its fix.
// why gives each node the extender's own reason. Real: every Kubernetes component, helm,
// gpuslice's binaries. Fake: NVML and the container runtime.
func TestDoctorFindsEachBreak(t *testing.T) {
	requireHost(t)
	values := valuesFile(t, doctorValues)
	gpuNode := map[string]string{"gpuslice.io/test-gpu": "true"}
	// The moved node's plugin watches a folder the kubelet does not use (short: socket paths).
	moved, err := os.MkdirTemp("", "dp-moved-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(moved) })
	opts := clusterOptions(
		cluster.NodeOptions{Name: "node-ok", Labels: gpuNode},
		cluster.NodeOptions{Name: "node-moved", Labels: gpuNode, NoPlugin: true, PluginArgs: []string{"--device-plugin-dir=" + moved}},
	)
	opts.Chart = &cluster.ChartOptions{Dir: chartDir(t), ValuesFiles: []string{values}}
	c := startClusterWith(t, opts)
	ctx := context.Background()
	ok, movedNode := c.Nodes[0], c.Nodes[1]

	// Healthy: every check of node-ok and of the cluster passes (the condition may be absent).
	checks, code := doctor(t, c, "node-ok")
	for _, ch := range checks {
		if ch.Result != "PASS" && ch.Name != "condition" {
			t.Errorf("healthy cluster: %+v", ch)
		}
	}
	if code != 0 {
		t.Errorf("doctor node-ok exit code %d, want 0", code)
	}
	for _, name := range []string{"plugin-pod", "plugin-ready", "allocatable", "ready-label", "heartbeat", "inventory", "kubelet-socket"} {
		if _, found := find(checks, "node-ok", name); !found {
			t.Errorf("doctor has no %s check of node-ok: %+v", name, checks)
		}
	}
	for _, name := range []string{"webhook", "webhook-endpoints", "webhook-admission", "scheduler-profile", "scheduler-leader", "extender"} {
		if _, found := find(checks, "", name); !found {
			t.Errorf("doctor has no cluster check %s: %+v", name, checks)
		}
	}
	status, _ := cli(t, c, "status")
	t.Logf("gpuslice status:\n%s", status)
	if !strings.Contains(status, "node-ok") || strings.Contains(status, "node-moved") {
		t.Errorf("status lists node-ok's GPUs only:\n%s", status)
	}

	// Wrong device-plugin folder: the plugin runs and heartbeats, but never registers.
	if err := movedNode.StartPlugin(); err != nil {
		t.Fatal(err)
	}
	waitCheck(t, c, "node-moved", "kubelet-socket", "FAIL", "not registered with the kubelet", "set devicePlugin.kubeletRootDir to the kubelet's --root-dir")
	if ch, _ := find(mustDoctor(t, c), "node-moved", "allocatable"); ch.Result != "FAIL" || !strings.Contains(ch.Message, "has not registered") {
		t.Errorf("node-moved allocatable: %+v, want FAIL: not registered", ch)
	}

	// why: a pod no T4 can hold gets, on each node, the reason the extender gives.
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	big := slicePod("too-big", 20480, 0)
	if _, err := pods.Create(ctx, big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPendingWith(t, c, "too-big", "insufficient memory")
	out, code := cli(t, c, "why", "too-big", "-o", "json")
	var why struct {
		Nodes []struct {
			Node, Reason, Message string
			Fits                  bool
		}
		Closest string
	}
	if err := json.Unmarshal([]byte(out), &why); err != nil || code != 0 {
		t.Fatalf("why -o json: exit %d, %v\n%s", code, err, out)
	}
	event := latestFailedScheduling(ctx, t, c, big.Name)
	for _, v := range why.Nodes {
		t.Logf("why too-big: %s %s %s", v.Node, v.Reason, v.Message)
		switch v.Node {
		case "node-ok":
			if v.Reason != string(vgpu.ReasonInsufficientMemory) {
				t.Errorf("why on node-ok: %+v, want %s", v, vgpu.ReasonInsufficientMemory)
			}
		case "node-moved":
			// The extender's words for this node are in the pod's FailedScheduling event.
			if !strings.HasPrefix(v.Message, "plugin not ready: ") || !strings.Contains(event, v.Message) {
				t.Errorf("why on node-moved: %q, want the extender's reason from the event %q", v.Message, event)
			}
		}
	}
	if why.Closest != "node-ok" {
		t.Errorf("why closest = %q, want node-ok", why.Closest)
	}
	// why judges through the extender's own code: asked about the pending pod, the extender's
	// /filter gives every node the reason and the words why gives it.
	reasons := extenderReasons(ctx, t, c, big.Name)
	if len(reasons) != len(why.Nodes) {
		t.Errorf("the extender judged %d nodes, why %d: %v", len(reasons), len(why.Nodes), reasons)
	}
	for _, v := range why.Nodes {
		if got, ok := reasons[v.Node]; !ok || got != v.Message {
			t.Errorf("node %s: extender says %q, why says %q", v.Node, got, v.Message)
		}
	}
	text, _ := cli(t, c, "why", "too-big")
	if !strings.Contains(text, "closest fit: node-ok (InsufficientMemory") {
		t.Errorf("why's table lacks the closest fit:\n%s", text)
	}
	waitCheck(t, c, "", "pending-pod", "WARN", "pod default/too-big pending", "kubectl gpuslice why too-big -n default")
	if err := pods.Delete(ctx, big.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Ready label removed by hand.
	setReadyLabel(ctx, t, c, ok.Name, nil)
	waitCheck(t, c, "node-ok", "ready-label", "FAIL", "label hami.io/gpu.ready is missing", "restart the plugin")
	ready := "true"
	setReadyLabel(ctx, t, c, ok.Name, &ready)
	waitCheck(t, c, "node-ok", "ready-label", "PASS", "hami.io/gpu.ready=true", "")

	// Stale heartbeat: the plugin is frozen and its Lease was last renewed five minutes ago.
	if err := ok.PausePlugin(); err != nil {
		t.Fatal(err)
	}
	staleLease(ctx, t, c, ok.Name, 5*time.Minute)
	waitCheck(t, c, "node-ok", "heartbeat", "FAIL", "longer than its", "restart the plugin")
	ok.ResumePlugin()
	waitCheck(t, c, "node-ok", "heartbeat", "PASS", "renewed", "")

	// Extender down: kube-scheduler cannot filter a new GPU pod.
	if err := c.StopExtender(); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, slicePod("no-extender", 1024, 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCheck(t, c, "", "extender", "FAIL", "cannot use the gpuslice extender", "-c extender")

	// Plugin stopped: the kubelet keeps the capacity for its grace period, allocatable drops to 0.
	if err := ok.StopPlugin(); err != nil {
		t.Fatal(err)
	}
	waitCheck(t, c, "node-ok", "allocatable", "FAIL", "allocatable 0", "restart the plugin")
	waitCheck(t, c, "node-ok", "ready-label", "FAIL", "hami.io/gpu.ready=false", "restart the plugin")

	// Webhook down: the API server cannot admit a GPU pod.
	if err := c.StopWebhook(); err != nil {
		t.Fatal(err)
	}
	waitCheck(t, c, "", "webhook-admission", "FAIL", "refused a dry-run GPU pod", "the webhook is down")
}

// mustDoctor runs doctor and returns its checks.
func mustDoctor(t *testing.T, c *cluster.Cluster) []check {
	t.Helper()
	checks, _ := doctor(t, c)
	return checks
}

// latestFailedScheduling returns the latest FailedScheduling message of pod name.
func latestFailedScheduling(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) string {
	t.Helper()
	p, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	failed, err := failedScheduling(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	return failed[p.UID]
}

// setReadyLabel sets node's ready label to value, or removes it when value is nil.
func setReadyLabel(ctx context.Context, t *testing.T, c *cluster.Cluster, node string, value *string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]*string{vgpu.LabelGPUReady: value}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// staleLease moves the renewTime of node's heartbeat Lease age into the past.
func staleLease(ctx context.Context, t *testing.T, c *cluster.Cluster, node string, age time.Duration) {
	t.Helper()
	leases := c.Client().CoordinationV1().Leases(vgpu.DefaultHeartbeatNamespace)
	l, err := leases.Get(ctx, vgpu.HeartbeatLeaseName(node), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-age)}
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// extenderReasons asks the extender's /filter, as kube-scheduler does (nodeCacheCapable: node
// names), about pod default/name on every Node of the cluster, and returns the message it turns
// each node away with.
func extenderReasons(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) map[string]string {
	t.Helper()
	pod, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := c.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(nodes.Items))
	for _, n := range nodes.Items {
		names = append(names, n.Name)
	}
	body, err := json.Marshal(&extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.ExtenderURL()+"/filter", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /filter: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var result extenderv1.ExtenderFilterResult
	if err := json.NewDecoder(resp.Body).Decode(&result); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /filter: HTTP %d, %v", resp.StatusCode, err)
	}
	if result.Error != "" || result.NodeNames != nil && len(*result.NodeNames) > 0 {
		t.Fatalf("extender's filter of %s: %+v, want every node turned away", name, result)
	}
	out := map[string]string{}
	for n, msg := range result.FailedNodes {
		out[n] = msg
	}
	for n, msg := range result.FailedAndUnresolvableNodes {
		out[n] = msg
	}
	return out
}

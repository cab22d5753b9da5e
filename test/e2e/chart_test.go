package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// chartValues are the test's values: nodes labelled gpuslice.io/test-gpu run the plugin with two
// fake T4s, and those also labelled gpuslice.io/config=a100 run the "a100" node configuration.
const chartValues = `devicePlugin:
  fakeGPUs: 2xT4-16GB
  nodeSelector:
    nvidia.com/gpu.present: null # drop the default selector: Helm merges maps
    gpuslice.io/test-gpu: "true"
  nodeConfigs:
    - name: a100
      fakeGPUs: 4xA100-80GB
      splitCount: 4
image:
  repository: gpuslice.example/gpuslice
  tag: test
scheduler:
  kubeScheduler:
    tag: v1.37.2
`

// policyDenial is the start of every denial of the chart's allocation policy.
const policyDenial = "hami.io/gpu-allocation is written only by the gpuslice scheduler extender (system:serviceaccount:gpuslice-system:gpuslice-scheduler)"

// chartDir is the chart, from test/e2e.
func chartDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "charts", "gpuslice"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// valuesFile writes chart values to a file of the test and returns its path.
func valuesFile(t *testing.T, values string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestChartInstallUpgradeUninstall is the chart's proof on the local cluster: helm install into the
// real API server succeeds; every gpuslice component (and kube-scheduler) runs with the command,
// arguments, environment and configuration files of the installed Deployments and DaemonSets, with
// their ServiceAccounts' RBAC; each node gets the DaemonSet its labels select; the API server calls
// the webhook through the chart's MutatingWebhookConfiguration and Service; pods then share GPUs
// with exactly their own slices. helm upgrade with changed values keeps the webhook's certificate
// and updates the objects; helm uninstall leaves no webhook configuration that blocks pod creation.
// Real: every Kubernetes component, helm, gpuslice's binaries. Fake: NVML and the container runtime.
func TestChartInstallUpgradeUninstall(t *testing.T) {
	requireHost(t)
	values := valuesFile(t, chartValues)
	opts := clusterOptions(
		cluster.NodeOptions{Name: "node-a100", Labels: map[string]string{"gpuslice.io/test-gpu": "true", "gpuslice.io/config": "a100"}},
		cluster.NodeOptions{Name: "node-t4", Labels: map[string]string{"gpuslice.io/test-gpu": "true"}},
	)
	opts.Chart = &cluster.ChartOptions{Dir: chartDir(t), ValuesFiles: []string{values}}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startClusterWith(t, opts)
	const ns = "gpuslice-system"

	// Every object of the release is in the API server.
	manifest, err := c.Helm(ctx, "get", "manifest", "gpuslice", "-n", ns)
	if err != nil {
		t.Fatalf("helm get manifest: %v\n%s", err, manifest)
	}
	mf := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(mf, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl := exec.CommandContext(ctx, filepath.Join(c.State.BinDir, "kubectl"), "--kubeconfig", c.State.Kubeconfig, "get", "-f", mf, "-o", "name") //nolint:gosec // G204: the cluster's kubectl
	out, err := kubectl.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get -f <release manifest>: %v\n%s", err, out)
	}
	t.Logf("release objects in the API server: %d", strings.Count(strings.TrimSpace(string(out)), "\n")+1)

	// Each node runs the DaemonSet its labels select, with that configuration's GPUs.
	want := map[string]struct {
		ds     string
		gpus   int
		model  string
		splits int
	}{
		"node-a100": {"gpuslice-device-plugin-a100", 4, "A100", 4},
		"node-t4":   {"gpuslice-device-plugin", 2, "T4", 10},
	}
	for _, n := range c.Nodes {
		w := want[n.Name]
		if n.PluginDaemonSet != w.ds {
			t.Errorf("%s runs DaemonSet %q, want %q", n.Name, n.PluginDaemonSet, w.ds)
		}
		_, inv, err := c.NodeInventory(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(inv.GPUs) != w.gpus || inv.SplitCount != w.splits || !strings.Contains(inv.GPUs[0].Model, w.model) {
			t.Errorf("%s: %d GPUs of %q split %d, want %d %s split %d", n.Name, len(inv.GPUs), inv.GPUs[0].Model, inv.SplitCount, w.gpus, w.model, w.splits)
		}
	}

	// Each plugin set its node's registration condition with its own pod-bound token (the chart's
	// RBAC and node policy allow it), and the extender follows kube-scheduler's Lease: it leads.
	for _, n := range c.Nodes {
		poll(t, 30*time.Second, n.Name+" condition True/Registered", func(ctx context.Context) (bool, string) {
			node, err := c.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			cond, _ := vgpu.RegisteredCondition(node)
			return cond.Status == corev1.ConditionTrue && cond.Reason == vgpu.ReasonRegistered, fmt.Sprintf("%s/%s %q", cond.Status, cond.Reason, cond.Message)
		})
	}
	poll(t, 30*time.Second, "the extender leading beside the kube-scheduler holding the chart's Lease", func(ctx context.Context) (bool, string) {
		l, err := c.Client().CoordinationV1().Leases(ns).Get(ctx, "gpuslice-scheduler", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got, err := scrapeGauges(c.ExtenderURL()+"/metrics", []string{extender.MetricLeader})
		return err == nil && got[extender.MetricLeader] == 1, fmt.Sprintf("holder %v, %s %v (%v)", l.Spec.HolderIdentity, extender.MetricLeader, got[extender.MetricLeader], err)
	})

	// The webhook that mutates pods is the chart's: the harness created none of its own.
	whs, err := c.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(whs.Items) != 1 || whs.Items[0].Labels["app.kubernetes.io/managed-by"] != "Helm" {
		t.Fatalf("MutatingWebhookConfigurations: %d, want exactly the chart's", len(whs.Items))
	}

	// Pods share GPUs, each with exactly its own slice.
	var pods []*corev1.Pod
	for i := range 16 {
		p := slicePod(fmt.Sprintf("chart-%02d", i), int64(2048*(1+i%4)), 0)
		if i%2 == 0 {
			p.Annotations = map[string]string{vgpu.AnnotationGPUModel: "A100"}
		}
		pods = append(pods, p)
	}
	createAll(t, c, pods)
	settled := waitSettled(t, c, "chart-", len(pods), 2*time.Minute)
	for _, b := range append(checkExact(t, c, settled.running), checkCapacity(t, c, settled.running)...) {
		t.Error(b)
	}
	if len(settled.running) != len(pods) {
		t.Errorf("%d of %d pods Running", len(settled.running), len(pods))
	}
	for _, p := range settled.running {
		if p.Spec.SchedulerName != "gpuslice-scheduler" {
			t.Errorf("%s: schedulerName %q", p.Name, p.Spec.SchedulerName)
		}
	}
	// The chart's ValidatingAdmissionPolicy: the extender's own ServiceAccount wrote every
	// allocation above; the cluster admin may not change one (the API server may take a moment
	// to load a new policy, hence the poll).
	if len(settled.running) > 0 {
		victim := settled.running[0]
		patch := []byte(`{"metadata":{"annotations":{"` + vgpu.AnnotationPodAllocation + `":"{}"}}}`)
		poll(t, 30*time.Second, "the admin's change of an allocation denied by the chart's policy", func(ctx context.Context) (bool, string) {
			_, err := c.Client().CoreV1().Pods(victim.Namespace).Patch(ctx, victim.Name, types.MergePatchType, patch, metav1.PatchOptions{})
			if err == nil {
				return false, "patch accepted"
			}
			return (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), policyDenial), err.Error()
		})
		cur, err := c.Client().CoreV1().Pods(victim.Namespace).Get(ctx, victim.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cur.Annotations[vgpu.AnnotationPodAllocation] != victim.Annotations[vgpu.AnnotationPodAllocation] {
			t.Errorf("%s: allocation changed to %q", victim.Name, cur.Annotations[vgpu.AnnotationPodAllocation])
		}
		other := []byte(`{"metadata":{"annotations":{"example.com/note":"fine"}}}`)
		if _, err := c.Client().CoreV1().Pods(victim.Namespace).Patch(ctx, victim.Name, types.MergePatchType, other, metav1.PatchOptions{}); err != nil {
			t.Errorf("admin changing another annotation: %v, want it allowed", err)
		}
	}

	checkAdminBindings(ctx, t, c)

	// The footprint the chart's resource requests and limits are set from.
	for _, p := range c.State.Processes {
		if strings.Contains(p.Name, "gpuslice") || strings.HasSuffix(p.Name, "device-plugin") || p.Name == "kube-scheduler" {
			if rss, peak, err := p.Memory(); err == nil {
				t.Logf("memory of %s: %d MiB resident, %d MiB peak", p.Name, rss/1024, peak/1024)
			}
		}
	}

	// helm upgrade with changed values: objects follow, the webhook's certificate is kept.
	secretName := "gpuslice-webhook-tls" //nolint:gosec // G101: a Secret's name, not a credential
	before, err := c.Client().CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.Helm(ctx, "upgrade", "gpuslice", chartDir(t), "-n", ns, "--reuse-values",
		"--set", "webhook.failurePolicy=Ignore", "--set", "scheduler.extender.nodePolicy=spread", "--set", "devicePlugin.splitCount=8"); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	after, err := c.Client().CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(before.Data["ca.crt"]) != string(after.Data["ca.crt"]) || string(before.Data["tls.crt"]) != string(after.Data["tls.crt"]) {
		t.Error("helm upgrade replaced the webhook's CA or certificate; want them kept")
	}
	wh, err := c.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "gpuslice-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fp := wh.Webhooks[0].FailurePolicy; fp == nil || *fp != "Ignore" {
		t.Errorf("after upgrade failurePolicy = %v, want Ignore", fp)
	}
	if string(wh.Webhooks[0].ClientConfig.CABundle) != string(after.Data["ca.crt"]) {
		t.Error("after upgrade the webhook's caBundle is not the kept CA")
	}
	cm, err := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, "gpuslice-scheduler", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cm.Data["extender.yaml"], "nodePolicy: spread") {
		t.Errorf("after upgrade extender.yaml = %q, want nodePolicy: spread", cm.Data["extender.yaml"])
	}
	// A pod still goes through the (still running) webhook.
	if _, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, slicePod("after-upgrade", 1024, 0), metav1.CreateOptions{}); err != nil {
		t.Errorf("create a GPU pod after helm upgrade: %v", err)
	}

	// helm uninstall: nothing of the release is left, and pods can be created with the
	// webhook's server gone.
	if out, err := c.Helm(ctx, "uninstall", "gpuslice", "-n", ns, "--wait", "--timeout", "60s"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	if _, err := c.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "gpuslice-webhook", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after helm uninstall the MutatingWebhookConfiguration is still there (err %v)", err)
	}
	if _, err := c.Client().AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "gpuslice-allocation", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after helm uninstall the ValidatingAdmissionPolicy is still there (err %v)", err)
	}
	for _, name := range []string{"gpuslice-device-plugin", "gpuslice-scheduler-extender"} {
		if _, err := c.Client().RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("after helm uninstall ClusterRole %s is still there (err %v)", name, err)
		}
	}
	if err := c.StopWebhook(); err != nil {
		t.Fatal(err)
	}
	plain := slicePod("plain-after-uninstall", 1024, 0)
	plain.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	if _, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Errorf("create a pod after helm uninstall with the webhook stopped: %v", err)
	}
}

// checkAdminBindings binds, as the cluster admin, a pod that no scheduler serves, the way a
// scheduler does: a Binding that carries hami.io/gpu-allocation (which the API server would copy
// onto the pod) is denied by the chart's policy and leaves the pod unbound; the same Binding
// without it, a plain kube-scheduler bind, binds the pod, which then runs.
func checkAdminBindings(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "admin-bound", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			SchedulerName:                 "no-scheduler",
			TerminationGracePeriodSeconds: new(int64),
			Containers:                    []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	binding := func(annotations map[string]string) *corev1.Binding {
		return &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, Annotations: annotations},
			Target:     corev1.ObjectReference{Kind: "Node", Name: "node-t4"},
		}
	}
	const want = policyDenial + "; "
	poll(t, 30*time.Second, "the admin's Binding with an allocation denied by the chart's policy", func(ctx context.Context) (bool, string) {
		err := pods.Bind(ctx, binding(map[string]string{vgpu.AnnotationPodAllocation: "{}"}), metav1.CreateOptions{})
		if err == nil {
			return false, "Binding accepted"
		}
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), want) && strings.Contains(err.Error(), "may not bind a pod with it"), err.Error()
	})
	if cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if cur.Spec.NodeName != "" || cur.Annotations[vgpu.AnnotationPodAllocation] != "" {
		t.Fatalf("after the denied Binding %s is on node %q with allocation %q, want unbound without one", pod.Name, cur.Spec.NodeName, cur.Annotations[vgpu.AnnotationPodAllocation])
	}
	if err := pods.Bind(ctx, binding(map[string]string{"example.com/note": "fine"}), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the admin's Binding without an allocation: %v, want it allowed", err)
	}
	waitRunningOn(t, c, pod.Name, "node-t4")
}

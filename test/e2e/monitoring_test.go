package e2e

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/test/demo"
	"github.com/gpuslice/gpuslice/test/monitoring"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Nodes of TestMonitoringDashboardAndAlerts beside the demo's: one whose plugin is killed, one
// whose kubelet is.
const (
	brokenPluginNode  = "gpu-broken"
	brokenKubeletNode = "gpu-no-kubelet"
	// overSliceMiB is what the over-slice container's process holds, against its 10,240 MiB slice.
	overSliceMiB = 12288
)

// TestMonitoringDashboardAndAlerts is the chart's monitoring against a real Prometheus: the
// cluster's Prometheus scrapes every component as the chart's ServiceMonitors say (every
// second) and evaluates the chart's rules; the demo's nodes run the demo's sample pods, beside a
// node whose plugin is killed (SIGKILL: its heartbeat goes stale) and one whose kubelet is (its
// plugin, running, can no longer register); one sample container's process holds more GPU
// memory than its slice (fake NVML processes mapped to the container by their cgroups), a host
// process holds memory on the same GPU, an idle GPU takes XID 79, and a pod that fits nowhere
// waits. Then every query of every dashboard panel must return at least one series with a
// finite value and the labels its legend shows, and every alert's expression must return
// exactly the series of its case: the plugin that cannot register, the stale heartbeat, the
// unhealthy GPU and the over-slice container; none for the pending pod, which has not waited
// 10 minutes. Those four alerts are then active in Prometheus's own evaluation of the rules
// (pending, or firing once their for: has passed; promtool's unit tests show the for: elapse).
// Real: every Kubernetes component, gpuslice's binaries, Prometheus, the chart's render. Fake:
// NVML and the container runtime.
func TestMonitoringDashboardAndAlerts(t *testing.T) {
	requireHost(t)
	install := monitoring.RequireInstall(t)
	began := time.Now()
	nodes := append(demo.Nodes(false),
		cluster.NodeOptions{Name: brokenPluginNode, FakeGPUs: "2xT4-16GB"},
		cluster.NodeOptions{Name: brokenKubeletNode, FakeGPUs: "2xT4-16GB"})
	for i := range nodes {
		// A heartbeat the extender calls stale after 5 s instead of a minute.
		nodes[i].PluginArgs = append(nodes[i].PluginArgs, "--lease-renew=1s", "--lease-duration=2s")
	}
	opts := clusterOptions(nodes...)
	opts.ExtenderArgs = []string{"--heartbeat-max-age=5s"}
	opts.Prometheus = &cluster.PrometheusOptions{Install: install, ChartDir: chartDir(t), ScrapeInterval: time.Second}
	c := startClusterWith(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	node := func(name string) *cluster.Node {
		for _, n := range c.Nodes {
			if n.Name == name {
				return n
			}
		}
		t.Fatalf("no node %s", name)
		return nil
	}

	// The broken nodes, before any pod: the demo's pods land on the demo's nodes.
	if err := node(brokenPluginNode).KillPlugin(); err != nil {
		t.Fatal(err)
	}
	if err := node(brokenKubeletNode).KillKubelet(); err != nil {
		t.Fatal(err)
	}
	// The extender turns both away before the first pod: the one by its stale heartbeat (the
	// condition it sets), the other by the ready label its plugin drops at once.
	poll(t, time.Minute, "the broken nodes turned away", func(ctx context.Context) (bool, string) {
		broken, err := c.Client().CoreV1().Nodes().Get(ctx, brokenPluginNode, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		noKubelet, err := c.Client().CoreV1().Nodes().Get(ctx, brokenKubeletNode, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		cond, _ := vgpu.RegisteredCondition(broken)
		return cond.Reason == vgpu.ReasonHeartbeatStale && noKubelet.Labels[cluster.LabelGPUReady] != "true",
			fmt.Sprintf("%s: %s/%s; %s: %s=%q", brokenPluginNode, cond.Status, cond.Reason, brokenKubeletNode, cluster.LabelGPUReady, noKubelet.Labels[cluster.LabelGPUReady])
	})
	if err := demo.RunSamplePods(ctx, c, demo.SamplePods(false)); err != nil {
		t.Fatal(err)
	}
	// A pod that fits no GPU, created last, so that the extender's latency has requests after
	// Prometheus saw its first ones.
	tooBig := demo.SamplePod{Name: "too-big", MemoryMiB: 200 * 1024}.Pod()
	tooBig.Labels = nil // not one of the sample pods RunSamplePods counts
	if _, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, tooBig, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The over-slice container: infer-0's process holds more than its 10 GiB slice; a host
	// process holds 512 MiB beside it (unattributed).
	over, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "infer-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := vgpu.ParsePodAllocation(over.Annotations[vgpu.AnnotationPodAllocation])
	if err != nil {
		t.Fatal(err)
	}
	overGPU := alloc.Containers[0].GPUs[0].UUID
	gpuIndex := func(nodeName, uuid string) int {
		_, inv, err := c.NodeInventory(ctx, nodeName)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range inv.GPUs {
			if g.UUID == uuid {
				return g.Index
			}
		}
		t.Fatalf("%s has no GPU %s", nodeName, uuid)
		return -1
	}
	if err := node(over.Spec.NodeName).SetGPUProcesses(ctx, gpuIndex(over.Spec.NodeName, overGPU), 70,
		cluster.GPUProcess{Pod: over, Container: "cuda", MemoryMiB: overSliceMiB}, cluster.GPUProcess{MemoryMiB: 512}); err != nil {
		t.Fatal(err)
	}
	// An idle GPU of the demo's A100 node falls off the bus.
	held := map[string]bool{}
	list, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if a, err := vgpu.ParsePodAllocation(p.Annotations[vgpu.AnnotationPodAllocation]); err == nil {
			for _, ca := range a.Containers {
				for _, s := range ca.GPUs {
					held[s.UUID] = true
				}
			}
		}
	}
	_, inv, err := c.NodeInventory(ctx, "gpu-a100")
	if err != nil {
		t.Fatal(err)
	}
	badGPU := ""
	for _, g := range inv.GPUs {
		if !held[g.UUID] {
			badGPU = g.UUID
			if _, err := nvidia.WriteFakeFault(node("gpu-a100").FaultsDir(), nvidia.FakeFault{GPU: g.Index, XID: 79}); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if badGPU == "" {
		t.Fatal("gpu-a100 has no idle GPU")
	}
	t.Logf("cluster, pods and breaks ready in %v: %s over its slice on %s/%s, XID 79 on gpu-a100/%s", time.Since(began).Round(100*time.Millisecond), over.Name, over.Spec.NodeName, overGPU, badGPU)

	client, err := promapi.NewClient(promapi.Config{Address: c.PrometheusURL()})
	if err != nil {
		t.Fatal(err)
	}
	prom := promv1.NewAPI(client)
	m := c.Monitoring()

	// Every panel.
	type panelQuery struct {
		panel string
		q     monitoring.Query
	}
	var queries []panelQuery
	for _, p := range m.Dashboard.Panels {
		for _, q := range p.Targets {
			queries = append(queries, panelQuery{p.Title, q})
		}
	}
	if len(queries) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	results := map[string]model.Vector{}
	judge := func(pq panelQuery, v model.Vector) string {
		if len(v) == 0 {
			return "no series"
		}
		finite := false
		for _, s := range v {
			for _, l := range pq.q.LegendLabels() {
				if s.Metric[model.LabelName(l)] == "" {
					return fmt.Sprintf("series %v lacks label %s of legend %q", s.Metric, l, pq.q.LegendFormat)
				}
			}
			finite = finite || !math.IsNaN(float64(s.Value)) && !math.IsInf(float64(s.Value), 0)
		}
		if !finite {
			return fmt.Sprintf("no finite value: %v", v)
		}
		return ""
	}
	// All in one round, so that the figures logged are one moment's.
	poll(t, 90*time.Second, "every dashboard query returning data", func(ctx context.Context) (bool, string) {
		var missing []string
		clear(results)
		for _, pq := range queries {
			key := pq.panel + " / " + pq.q.RefID
			v, err := instant(ctx, prom, pq.q.Expr)
			if err != nil {
				missing = append(missing, key+": "+err.Error())
				continue
			}
			if why := judge(pq, v); why != "" {
				missing = append(missing, key+": "+why)
				continue
			}
			results[key] = v
		}
		return len(missing) == 0, strings.Join(missing, "; ")
	})
	for _, pq := range queries {
		key := pq.panel + " / " + pq.q.RefID
		t.Logf("panel %q %s (%s):\n%s", pq.panel, pq.q.RefID, pq.q.Expr, describe(results[key]))
	}
	// The figures the panels show are the cluster's: memory the pods were granted, what the fake
	// processes hold, the XID, the over-slice pod, the pod that waits.
	var grantedMiB int64
	for _, p := range list.Items {
		if a, err := vgpu.ParsePodAllocation(p.Annotations[vgpu.AnnotationPodAllocation]); err == nil {
			for _, ca := range a.Containers {
				for _, sl := range ca.GPUs {
					grantedMiB += sl.MemoryMiB
				}
			}
		}
	}
	panelExpr := func(title, ref string) string {
		for _, pq := range queries {
			if pq.panel == title && pq.q.RefID == ref {
				return pq.q.Expr
			}
		}
		t.Fatalf("the dashboard has no query %s of panel %q", ref, title)
		return ""
	}
	figures := []struct{ expr, want string }{
		{`sum(max by (node, gpu) (gpuslice_gpu_memory_allocated_mib))`, fmt.Sprintf("{} => %d", grantedMiB)},
		{`sum(gpuslice_deviceplugin_gpu_memory_used_mib)`, fmt.Sprintf("{} => %d", overSliceMiB+512)},
		{`sum(gpuslice_deviceplugin_gpu_memory_unattributed_mib)`, "{} => 512"},
		// The GPU's first XID 79, which increase() alone does not count.
		{panelExpr("GPU health and XIDs", "B"), `{node="gpu-a100", xid="79"} => 1`},
		{`topk(1, sum by (namespace, pod) (gpuslice_deviceplugin_container_gpu_memory_used_mib))`, fmt.Sprintf(`{namespace="default", pod="infer-0"} => %d`, overSliceMiB)},
		{`sum(max by (reason) (gpuslice_extender_pending_pods))`, "{} => 1"},
		{`count(max by (node, reason) (gpuslice_extender_node_unregistered))`, "{} => 2"},
		{panelExpr("GPU health and XIDs", "A"), `{node="gpu-a100"} => 1`},
	}
	poll(t, 30*time.Second, "the panels' figures", func(ctx context.Context) (bool, string) {
		var wrong []string
		for _, f := range figures {
			v, err := instant(ctx, prom, f.expr)
			if err != nil {
				wrong = append(wrong, err.Error())
				continue
			}
			var got []string
			for _, s := range v {
				got = append(got, fmt.Sprintf("%s => %v", s.Metric, s.Value))
			}
			if strings.Join(got, "; ") != f.want {
				wrong = append(wrong, fmt.Sprintf("%s = %q, want %q", f.expr, got, f.want))
			}
		}
		return len(wrong) == 0, strings.Join(wrong, "; ")
	})
	for _, expr := range []string{"up", "scrape_duration_seconds"} {
		if v, err := instant(ctx, prom, expr); err == nil {
			t.Logf("%s:\n%s", expr, describe(v))
		}
	}

	// Every alert's expression returns the series of its case, and only those.
	overSlice := fmt.Sprintf("container=cuda,gpu=%s,namespace=default,node=%s,pod=infer-0", overGPU, over.Spec.NodeName)
	want := map[string][]string{
		"GPUSlicePluginNotRegistered": {"node=" + brokenKubeletNode},
		"GPUSliceHeartbeatStale":      {"node=" + brokenPluginNode},
		"GPUSliceGPUUnhealthy":        {"gpu=" + badGPU + ",node=gpu-a100"},
		"GPUSlicePodsPendingTooLong":  nil,
		"GPUSliceContainerOverSlice":  {overSlice},
	}
	// The labels that tell the alerts' cases apart; the scrape's own (job, instance, ...) are
	// left out.
	keyOf := func(alert string, s model.LabelSet) string {
		var keys []string
		for _, l := range []string{"node", "gpu", "namespace", "pod", "container", "reason"} {
			if alert == "GPUSliceGPUUnhealthy" && (l == "pod" || l == "namespace" || l == "container") {
				continue // the plugin's own pod, from the scrape
			}
			if v, ok := s[model.LabelName(l)]; ok {
				keys = append(keys, l+"="+string(v))
			}
		}
		sort.Strings(keys)
		return strings.Join(keys, ",")
	}
	alerts := m.Alerts()
	if len(alerts) != len(want) {
		t.Errorf("the chart has %d alerts, the test knows %d", len(alerts), len(want))
	}
	poll(t, 60*time.Second, "every alert expression returning its case", func(ctx context.Context) (bool, string) {
		var wrong []string
		for _, a := range alerts {
			v, err := instant(ctx, prom, a.Expr)
			if err != nil {
				wrong = append(wrong, a.Alert+": "+err.Error())
				continue
			}
			var got []string
			for _, s := range v {
				got = append(got, keyOf(a.Alert, model.LabelSet(s.Metric)))
			}
			sort.Strings(got)
			if !slices.Equal(got, want[a.Alert]) {
				wrong = append(wrong, fmt.Sprintf("%s: %q, want %q", a.Alert, got, want[a.Alert]))
			}
		}
		return len(wrong) == 0, strings.Join(wrong, "; ")
	})
	for _, a := range alerts {
		v, err := instant(ctx, prom, a.Expr)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("alert %s (%s):\n%s", a.Alert, a.Expr, describe(v))
	}
	if v, err := instant(ctx, prom, "max by (reason) (gpuslice_extender_pending_pod_oldest_seconds)"); err == nil {
		t.Logf("GPUSlicePodsPendingTooLong does not fire: its pods have waited (s):\n%s", describe(v))
	}

	// Prometheus's own evaluation of the chart's rules has the four alerts active.
	poll(t, 30*time.Second, "the alerts active in Prometheus", func(ctx context.Context) (bool, string) {
		res, err := prom.Alerts(ctx)
		if err != nil {
			return false, err.Error()
		}
		active := map[string][]string{}
		var seen []string
		for _, al := range res.Alerts {
			name := string(al.Labels["alertname"])
			active[name] = append(active[name], keyOf(name, al.Labels))
			seen = append(seen, fmt.Sprintf("%s{%s} %s", name, keyOf(name, al.Labels), al.State))
		}
		for name, keys := range want {
			sort.Strings(active[name])
			if !slices.Equal(active[name], keys) {
				return false, strings.Join(seen, "; ")
			}
		}
		return true, strings.Join(seen, "; ")
	})
	res, err := prom.Alerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, al := range res.Alerts {
		t.Logf("Prometheus alert %s %s since %s: %s", al.Labels["alertname"], al.State, al.ActiveAt.Format(time.TimeOnly), al.Annotations["summary"])
	}
	t.Logf("monitoring test took %v", time.Since(began).Round(100*time.Millisecond))
}

// instant evaluates expr at the current time.
func instant(ctx context.Context, prom promv1.API, expr string) (model.Vector, error) {
	v, _, err := prom.Query(ctx, expr, time.Now())
	if err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("query %q: a %s, want a vector", expr, v.Type())
	}
	return vec, nil
}

// describe lists a vector's series, one a line, without the scrape's own labels.
func describe(v model.Vector) string {
	if len(v) == 0 {
		return "  (no series)"
	}
	var lines []string
	for _, s := range v {
		m := s.Metric.Clone()
		for _, l := range []model.LabelName{"job", "instance", "service", "endpoint"} {
			delete(m, l)
		}
		lines = append(lines, fmt.Sprintf("  %v = %v", m, s.Value))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

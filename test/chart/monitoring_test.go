package chart

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/yaml"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/webhook"
)

// exportedMetrics returns the names of the metrics the three components register, read from
// the components themselves (each lists the collectors it registered), not from a list here.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	logger, _ := ktesting.NewTestContext(t)
	lib, err := nvidia.NewFake("1xA100-80GB", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	backend, err := nvidia.Open(nvidia.Options{Library: lib, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = backend.Close() })
	cfg := deviceplugin.DefaultConfig()
	cfg.NodeName = "node-1"
	plugin, err := deviceplugin.New(cfg, backend, deviceplugin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := extender.New(extender.DefaultConfig(), extender.Options{Client: fake.NewClientset()})
	if err != nil {
		t.Fatal(err)
	}
	hook, err := webhook.MetricNames()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, n := range slices.Concat(plugin.MetricNames(), s.MetricNames(), hook) {
		names[n] = true
	}
	return names
}

var (
	// promqlStrings, promqlRanges and promqlMatchers are the parts of a PromQL expression that
	// hold no metric name: string literals, range and subquery selectors, label matchers.
	promqlStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	// promqlNumbers are numbers and durations (5m, 1.5, 1e3).
	promqlNumbers = regexp.MustCompile(`\b[0-9][0-9a-zA-Z.]*`)
	// promqlLabelLists are the label lists of grouping and vector matching.
	promqlLabelLists = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	// promqlIdent is an identifier, with what follows it.
	promqlIdent = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	// promqlKeywords are the identifiers that are operators or modifiers.
	promqlKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true,
		"on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression selects: every identifier that is
// not a function or aggregation (followed by "("), a keyword, a label name (in a matcher or a
// label list) or part of a string or duration.
func metricNames(expr string) []string {
	e := promqlStrings.ReplaceAllString(expr, `""`)
	e = promqlRanges.ReplaceAllString(e, "")
	e = promqlMatchers.ReplaceAllString(e, "")
	e = promqlLabelLists.ReplaceAllString(e, "")
	e = promqlNumbers.ReplaceAllString(e, "")
	var out []string
	for _, m := range promqlIdent.FindAllString(e, -1) {
		if strings.HasSuffix(m, "(") || promqlKeywords[strings.ToLower(m)] {
			continue
		}
		out = append(out, m)
	}
	return out
}

func TestMetricNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`sum by (node, gpu) (rate(a_total{result="x", b=~"y|z"}[5m]))`, []string{"a_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(d_seconds_bucket[$__rate_interval])))`, []string{"d_seconds_bucket"}},
		{`u_mib > on (namespace, pod) group_left(node) l_mib / 60`, []string{"u_mib", "l_mib"}},
		{`max(x{reason!="on (a)"}) == 1 and bool y offset 5m`, []string{"x", "y"}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, metricNames(tt.expr)); diff != "" {
			t.Errorf("metricNames(%q) (-want +got):\n%s", tt.expr, diff)
		}
	}
}

// grafanaDashboard is the part of a Grafana dashboard the test reads.
type grafanaDashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// ruleGroups is the part of a PrometheusRule's spec.groups the test reads.
type ruleGroups []struct {
	Name  string `json:"name"`
	Rules []struct {
		Alert string `json:"alert"`
		Expr  string `json:"expr"`
		For   string `json:"for"`
	} `json:"rules"`
}

// TestMonitoringUsesExportedMetrics renders the chart with the dashboard and the alerts on and
// checks that every metric their queries select is one a component exports (a histogram's
// _bucket, _sum and _count of an exported histogram), that every panel queries something, and
// that the alerts the chart promises are there.
func TestMonitoringUsesExportedMetrics(t *testing.T) {
	h := requireHelm(t)
	out, err := h.template(filepath.Join(filepath.FromSlash(valuesDir), "monitoring.yaml"))
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	objs, err := parseRender(out)
	if err != nil {
		t.Fatal(err)
	}
	r := rendered{objs: objs}
	exported := exportedMetrics(t)
	check := func(where, expr string) {
		t.Helper()
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: %q selects no metric", where, expr)
		}
		for _, n := range names {
			base := n
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(n, suffix); ok && exported[b] {
					base = b
				}
			}
			if !exported[base] {
				t.Errorf("%s: %q selects %s, which no gpuslice component exports", where, expr, n)
			}
		}
	}

	cm := r.find("ConfigMap", releaseName+"-dashboard")
	if cm == nil {
		t.Fatal("no dashboard ConfigMap rendered")
	}
	if got := cm.u.GetLabels()["grafana_dashboard"]; got != "1" || cm.u.GetNamespace() != "monitoring" {
		t.Errorf("dashboard ConfigMap in %q with grafana_dashboard=%q, want monitoring and 1", cm.u.GetNamespace(), got)
	}
	var dash grafanaDashboard
	if err := json.Unmarshal([]byte(cm.typed.(*corev1.ConfigMap).Data["gpuslice.json"]), &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("the dashboard has no panels")
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			check("panel "+p.Title, q.Expr)
		}
	}

	rule := r.find("PrometheusRule", releaseName)
	if rule == nil {
		t.Fatal("no PrometheusRule rendered")
	}
	groupsValue, _, err := unstructured.NestedSlice(rule.u.Object, "spec", "groups")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(groupsValue)
	if err != nil {
		t.Fatal(err)
	}
	var groups ruleGroups
	if err := yaml.Unmarshal(raw, &groups); err != nil {
		t.Fatalf("PrometheusRule groups: %v", err)
	}
	var alerts []string
	for _, g := range groups {
		for _, rl := range g.Rules {
			alerts = append(alerts, rl.Alert)
			check("alert "+rl.Alert, rl.Expr)
			if rl.For != "" {
				if _, err := time.ParseDuration(rl.For); err != nil {
					t.Errorf("alert %s: for %q: %v", rl.Alert, rl.For, err)
				}
			}
		}
	}
	want := []string{"GPUSlicePluginNotRegistered", "GPUSliceHeartbeatStale", "GPUSliceGPUUnhealthy", "GPUSlicePodsPendingTooLong", "GPUSliceContainerOverSlice"}
	if diff := cmp.Diff(want, alerts); diff != "" {
		t.Errorf("alerts (-want +got):\n%s", diff)
	}
}

package chart

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gpuslice/gpuslice/test/monitoring"
)

// alertTests is the promtool unit-test file of the chart's alerts; it names the rendered rules
// rulesFile.
const (
	alertTests = "testdata/alerts-test.yaml"
	rulesFile  = "gpuslice-rules.yaml"
)

// renderMonitoring renders the chart with the monitoring values and returns its monitoring.
func renderMonitoring(t *testing.T) *monitoring.Chart {
	t.Helper()
	h := requireHelm(t)
	out, err := h.template(filepath.Join(filepath.FromSlash(valuesDir), "monitoring.yaml"))
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	m, err := monitoring.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// promtoolTests is the part of a promtool unit-test file the test reads.
type promtoolTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertRules runs promtool on the alerts the chart renders: check rules, then the unit tests
// of testdata/alerts-test.yaml (each alert fires after its for: for input series that should
// fire it, not before, and not for series that should not). The rules are the rendered
// PrometheusRule's spec.groups, not a copy. It also checks that every alert has a case where it
// fires and one where it does not, and that the tests name no alert the chart lacks.
func TestAlertRules(t *testing.T) {
	prom := monitoring.RequireInstall(t)
	m := renderMonitoring(t)
	rules, err := m.RuleFile()
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(alertTests)
	if err != nil {
		t.Fatal(err)
	}
	var parsed promtoolTests // only the fields above: promtool checks the rest
	if err := yaml.Unmarshal(tests, &parsed); err != nil {
		t.Fatalf("%s: %v", alertTests, err)
	}
	if !slices.Equal(parsed.RuleFiles, []string{rulesFile}) {
		t.Fatalf("%s: rule_files %q, want [%s] (the rendered rules)", alertTests, parsed.RuleFiles, rulesFile)
	}

	dir := t.TempDir()
	rulesPath, testsPath := filepath.Join(dir, rulesFile), filepath.Join(dir, filepath.Base(alertTests))
	if err := os.WriteFile(rulesPath, rules, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(testsPath, tests, 0o600); err != nil { //nolint:gosec // G703: a file of the test's own temporary folder
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := prom.CheckRules(ctx, rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("promtool check rules:\n%s", out)
	began := time.Now()
	out, err = prom.TestRules(ctx, testsPath)
	if err != nil {
		t.Fatalf("%v\nrendered rules:\n%s", err, rules)
	}
	t.Logf("promtool test rules (%v):\n%s", time.Since(began).Round(time.Millisecond), out)

	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range parsed.Tests {
		for _, at := range tc.AlertRuleTest {
			if len(at.ExpAlerts) > 0 {
				fires[at.Alertname] = true
			} else {
				quiet[at.Alertname] = true
			}
		}
	}
	var alerts []string
	for _, a := range m.Alerts() {
		alerts = append(alerts, a.Alert)
		if !fires[a.Alert] {
			t.Errorf("%s: no case where %s fires", alertTests, a.Alert)
		}
		if !quiet[a.Alert] {
			t.Errorf("%s: no case where %s does not fire", alertTests, a.Alert)
		}
	}
	for _, tc := range parsed.Tests {
		for _, at := range tc.AlertRuleTest {
			if !slices.Contains(alerts, at.Alertname) {
				t.Errorf("%s: test %q tests %s, which the chart has no alert of", alertTests, tc.Name, at.Alertname)
			}
		}
	}
}

// TestPrometheusConfig checks that the Prometheus configuration the chart's ServiceMonitors
// imply (monitoring.Chart.Config, what the local cluster's Prometheus runs with) is one
// promtool accepts, with a job per ServiceMonitor endpoint.
func TestPrometheusConfig(t *testing.T) {
	prom := monitoring.RequireInstall(t)
	m := renderMonitoring(t)
	pods := []monitoring.Pod{
		{Component: "scheduler", Name: "gpuslice-scheduler-0", Node: "cp", Address: "127.0.0.1:8889"},
		{Component: "webhook", Name: "gpuslice-webhook-0", Node: "cp", Address: "127.0.0.1:9443"},
		{Component: "device-plugin", Name: "gpuslice-device-plugin-a", Node: "gpu-a", Address: "127.0.0.1:8090"},
	}
	dir := t.TempDir()
	rules, err := m.RuleFile()
	if err != nil {
		t.Fatal(err)
	}
	rulesPath := filepath.Join(dir, rulesFile)
	if err := os.WriteFile(rulesPath, rules, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := m.Config(pods, monitoring.ConfigOptions{ScrapeInterval: time.Second, RuleFiles: []string{rulesPath}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := prom.CheckConfig(ctx, path); err != nil {
		t.Fatalf("%v\n%s", err, cfg)
	} else {
		t.Logf("promtool check config:\n%s", out)
	}
	want := []string{
		"serviceMonitor/gpuslice-system/gpuslice-device-plugin/0",
		"serviceMonitor/gpuslice-system/gpuslice-scheduler/0",
		"serviceMonitor/gpuslice-system/gpuslice-webhook/0",
	}
	if got := m.Jobs(); !slices.Equal(got, want) {
		t.Errorf("jobs %q, want %q", got, want)
	}
}

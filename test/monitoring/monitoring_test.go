package monitoring

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestLegendLabels(t *testing.T) {
	tests := []struct {
		legend string
		want   []string
	}{
		{"{{node}} {{gpu}}", []string{"node", "gpu"}},
		{"{{ node }}: {{reason}} and {{node}} again", []string{"node", "reason"}},
		{"allocated (slices' limits)", nil},
		{"", nil},
	}
	for _, tt := range tests {
		t.Run(tt.legend, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Query{LegendFormat: tt.legend}.LegendLabels()); diff != "" {
				t.Errorf("LegendLabels (-want +got):\n%s", diff)
			}
		})
	}
}

func TestModelDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{time.Second, "1s"},
		{90 * time.Second, "90s"},
		{500 * time.Millisecond, "500ms"},
	}
	for _, tt := range tests {
		if got := model(tt.d); got != tt.want {
			t.Errorf("model(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

// TestParseKeepsOnlyMonitoring parses a render with a ServiceMonitor, a PrometheusRule and a
// kind it does not read, and rejects a ServiceMonitor field Config would not translate.
func TestParseKeepsOnlyMonitoring(t *testing.T) {
	render := []byte(`apiVersion: v1
kind: Secret
metadata: {name: s}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: sm, namespace: ns}
spec:
  selector: {matchLabels: {a: b}}
  endpoints: [{port: metrics}]
---
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: r, namespace: ns}
spec:
  groups: [{name: g, rules: [{alert: A, expr: up == 0, for: 1m}]}]
`)
	c, err := Parse(render)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"serviceMonitor/ns/sm/0"}, c.Jobs()); diff != "" {
		t.Errorf("Jobs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Rule{{Alert: "A", Expr: "up == 0", For: "1m"}}, c.Alerts()); diff != "" {
		t.Errorf("Alerts (-want +got):\n%s", diff)
	}
	bad := []byte(`apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: sm, namespace: ns}
spec:
  selector: {}
  endpoints: [{port: metrics, metricRelabelings: [{action: drop}]}]
`)
	if _, err := Parse(bad); err == nil {
		t.Error("Parse accepted a ServiceMonitor with metricRelabelings, which Config does not translate")
	}
}

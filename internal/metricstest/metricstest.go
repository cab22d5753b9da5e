// Package metricstest reads a Prometheus /metrics endpoint in tests and
// returns its samples keyed by series, so that a test compares the series
// it cares about with cmp.Diff.
package metricstest

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape GETs url with client (nil: http.DefaultClient), expects 200 with
// the Prometheus text format, and returns every sample by series: counters,
// gauges and untyped values under `name{label="value",...}` (labels sorted
// by name; just `name` without labels), and of each histogram and summary
// its `name_count` and `name_sum` series. It fails the test on any error.
func Scrape(t testing.TB, client *http.Client, url string) map[string]float64 {
	t.Helper()
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d, want 200", url, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: not the Prometheus text format: %v", url, err)
	}
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := m.GetLabel()
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[Series(name, pairs(labels)...)] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[Series(name, pairs(labels)...)] = m.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				out[Series(name, pairs(labels)...)] = m.GetUntyped().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[Series(name+"_count", pairs(labels)...)] = float64(m.GetHistogram().GetSampleCount())
				out[Series(name+"_sum", pairs(labels)...)] = m.GetHistogram().GetSampleSum()
			case dto.MetricType_SUMMARY:
				out[Series(name+"_count", pairs(labels)...)] = float64(m.GetSummary().GetSampleCount())
				out[Series(name+"_sum", pairs(labels)...)] = m.GetSummary().GetSampleSum()
			}
		}
	}
	return out
}

// Pick returns the samples whose series name (the part before "{") is one
// of names.
func Pick(samples map[string]float64, names ...string) map[string]float64 {
	out := map[string]float64{}
	for key, v := range samples {
		base, _, _ := strings.Cut(key, "{")
		for _, n := range names {
			if base == n {
				out[key] = v
				break
			}
		}
	}
	return out
}

// Series is the key Scrape uses for metric name with labels given as
// name, value pairs: `name{a="1",b="2"}`, labels sorted by name. An odd
// trailing label name gets an empty value.
func Series(name string, labels ...string) string {
	if len(labels) == 0 {
		return name
	}
	type pair struct{ k, v string }
	ps := make([]pair, 0, (len(labels)+1)/2)
	for i := 0; i < len(labels); i += 2 {
		p := pair{k: labels[i]}
		if i+1 < len(labels) {
			p.v = labels[i+1]
		}
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].k < ps[j].k })
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	for i, p := range ps {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p.k)
		b.WriteString(`="`)
		b.WriteString(p.v)
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

func pairs(labels []*dto.LabelPair) []string {
	out := make([]string, 0, 2*len(labels))
	for _, l := range labels {
		out = append(out, l.GetName(), l.GetValue())
	}
	return out
}

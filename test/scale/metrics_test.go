package scale

import (
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHistogramQuantile(t *testing.T) {
	t.Parallel()
	inf := math.Inf(1)
	tests := map[string]struct {
		h    histogram
		q    float64
		want float64
	}{
		"empty":                  {h: histogram{bounds: []float64{0.1, inf}, counts: []float64{0, 0}}, q: 0.5, want: math.NaN()},
		"first bucket from zero": {h: histogram{bounds: []float64{0.1, 1, inf}, counts: []float64{10, 10, 10}}, q: 0.5, want: 0.05},
		"interpolated in bucket": {h: histogram{bounds: []float64{0.1, 1, inf}, counts: []float64{50, 100, 100}}, q: 0.75, want: 0.55},
		"p99 at a bound":         {h: histogram{bounds: []float64{0.1, 1, inf}, counts: []float64{99, 100, 100}}, q: 0.99, want: 0.1},
		"rank in +Inf bucket":    {h: histogram{bounds: []float64{0.1, 1, inf}, counts: []float64{0, 10, 100}}, q: 0.99, want: 1},
		"empty buckets skipped":  {h: histogram{bounds: []float64{0.1, 1, 10, inf}, counts: []float64{0, 0, 4, 4}}, q: 0.5, want: 5.5},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := tc.h.quantile(tc.q)
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b float64) bool {
				return math.IsNaN(a) && math.IsNaN(b) || math.Abs(a-b) < 1e-9
			})); diff != "" {
				t.Errorf("quantile(%v) (-want +got):\n%s", tc.q, diff)
			}
		})
	}
}

func TestHistogramSub(t *testing.T) {
	t.Parallel()
	inf := math.Inf(1)
	after := histogram{bounds: []float64{0.1, inf}, counts: []float64{15, 20}}
	tests := map[string]struct {
		before histogram
		want   []float64
	}{
		"deltas":                 {before: histogram{bounds: []float64{0.1, inf}, counts: []float64{5, 6}}, want: []float64{10, 14}},
		"no earlier scrape":      {before: histogram{}, want: []float64{15, 20}},
		"other bounds: as empty": {before: histogram{bounds: []float64{inf}, counts: []float64{3}}, want: []float64{15, 20}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tc.want, after.sub(tc.before).counts); diff != "" {
				t.Errorf("sub (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseMetricsKeepsOnlyNamedFamilies(t *testing.T) {
	t.Parallel()
	text := `# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 7
apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 5
apiserver_request_total{code="200",resource="pods",subresource="",verb="GET"} 2
# HELP apiserver_request_total_other Not it.
# TYPE apiserver_request_total_other counter
apiserver_request_total_other 9
# HELP d A histogram.
# TYPE d histogram
d_bucket{le="0.1"} 1
d_bucket{le="+Inf"} 2
d_sum 0.3
d_count 2
`
	families, err := parseMetrics(strings.NewReader(text), apiRequestsMetric, "d")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"apiserver_request_total", "d"}, sortedKeys(families)); diff != "" {
		t.Errorf("families (-want +got):\n%s", diff)
	}
	got := Requests{}
	for _, m := range families[apiRequestsMetric].GetMetric() {
		l := labels(m)
		got[Request{Verb: l["verb"], Resource: l["resource"], Subresource: l["subresource"]}] += m.GetCounter().GetValue()
	}
	want := Requests{{Verb: "POST", Resource: "pods"}: 7, {Verb: "POST", Resource: "pods", Subresource: "binding"}: 5, {Verb: "GET", Resource: "pods"}: 2}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Request{{Verb: "POST", Resource: "pods"}, {Verb: "POST", Resource: "pods", Subresource: "binding"}}, got.Top(2)); diff != "" {
		t.Errorf("Top(2) (-want +got):\n%s", diff)
	}
	if got, want := got.Without("pods"), 0.0; got != want {
		t.Errorf("Without(pods) = %v, want %v", got, want)
	}
}

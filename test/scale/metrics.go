package scale

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/extender"
)

// apiRequestsMetric is the API server's counter of the requests it served.
const apiRequestsMetric = "apiserver_request_total"

// Request is one kind of API request: verb (as apiserver_request_total labels it: GET, LIST,
// WATCH, POST, PUT, PATCH, DELETE, …), resource and subresource.
type Request struct {
	Verb, Resource, Subresource string
}

// String renders r as "POST pods/binding" (for a non-resource request, the API server's
// subresource label holds the path: "GET /metrics").
func (r Request) String() string {
	if r.Resource == "" {
		return r.Verb + " " + r.Subresource // a non-resource path, e.g. /metrics
	}
	if r.Subresource != "" {
		return r.Verb + " " + r.Resource + "/" + r.Subresource
	}
	return r.Verb + " " + r.Resource
}

// Requests counts API requests by kind.
type Requests map[Request]float64

// Total is the sum over every kind.
func (r Requests) Total() float64 {
	var t float64
	for _, v := range r {
		t += v
	}
	return t
}

// Without returns the total over the kinds whose resource is not one of resources.
func (r Requests) Without(resources ...string) float64 {
	var t float64
	for k, v := range r {
		skip := false
		for _, res := range resources {
			skip = skip || k.Resource == res
		}
		if !skip {
			t += v
		}
	}
	return t
}

// Top returns the n kinds with the most requests, most first (ties by name).
func (r Requests) Top(n int) []Request {
	keys := make([]Request, 0, len(r))
	for k, v := range r {
		if v > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if r[keys[i]] != r[keys[j]] {
			return r[keys[i]] > r[keys[j]]
		}
		return keys[i].String() < keys[j].String()
	})
	return keys[:min(n, len(keys))]
}

// Sub returns r − before, per kind.
func (r Requests) Sub(before Requests) Requests {
	out := Requests{}
	for k, v := range r {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// ScrapeAPIRequests reads apiserver_request_total from the API server's /metrics, summed over
// every label but verb, resource and subresource.
func ScrapeAPIRequests(ctx context.Context, client kubernetes.Interface) (Requests, error) {
	body, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET kube-apiserver /metrics: %w", err)
	}
	families, err := parseMetrics(bytes.NewReader(body), apiRequestsMetric)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	out := Requests{}
	for _, m := range families[apiRequestsMetric].GetMetric() {
		l := labels(m)
		out[Request{Verb: l["verb"], Resource: l["resource"], Subresource: l["subresource"]}] += m.GetCounter().GetValue()
	}
	return out, nil
}

// extenderScrape is what the harness reads from the extender's /metrics.
type extenderScrape struct {
	// durations holds the request-duration histogram by verb.
	durations map[string]histogram
	// binds counts Bind calls by result.
	binds map[string]float64
	// retries counts the pods the extender asked kube-scheduler to retry.
	retries float64
	// gpus is the number of GPUs the extender exports schedulable memory for: the GPUs of
	// every Node its informers have seen.
	gpus int
	// heapInuseBytes is the Go heap in use (go_memstats_heap_inuse_bytes): live objects and
	// what the collector has not reclaimed yet, the part of RSS the code can shrink.
	heapInuseBytes float64
	// goMemory is the rest of the Go runtime's account of its memory, by gauge (goMemGauges).
	goMemory map[string]float64
}

// metricHeapInuse is the Go collector's heap-in-use gauge, which every gpuslice binary serves.
const metricHeapInuse = "go_memstats_heap_inuse_bytes"

// The Go collector's other memory gauges the harness reads: with the heap in use they say
// where a process's RSS goes (heap pages idle but not returned to the OS, stacks, the
// runtime's own structures) and how far the heap may grow before the next collection.
const (
	metricHeapIdle     = "go_memstats_heap_idle_bytes"
	metricHeapReleased = "go_memstats_heap_released_bytes"
	metricStackInuse   = "go_memstats_stack_inuse_bytes"
	metricSys          = "go_memstats_sys_bytes"
	metricNextGC       = "go_memstats_next_gc_bytes"
	metricGCSys        = "go_memstats_gc_sys_bytes"
	metricMSpanSys     = "go_memstats_mspan_sys_bytes"
	metricOtherSys     = "go_memstats_other_sys_bytes"
)

var goMemGauges = []string{metricHeapIdle, metricHeapReleased, metricStackInuse, metricSys, metricNextGC, metricGCSys, metricMSpanSys, metricOtherSys}

// histogram is one Prometheus histogram: cumulative counts per upper bound, +Inf last.
type histogram struct {
	bounds []float64
	counts []float64
}

// scrapeExtender reads the extender's request-duration histogram, its bind counter and how many
// GPUs it knows from its /metrics at url.
func scrapeExtender(ctx context.Context, url string) (extenderScrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return extenderScrape{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return extenderScrape{}, fmt.Errorf("GET %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return extenderScrape{}, fmt.Errorf("GET %s: HTTP %d, want 200", url, resp.StatusCode)
	}
	families, err := parseMetrics(resp.Body, append([]string{extender.MetricRequestDuration, extender.MetricBinds, extender.MetricGPUMemorySchedulable, extender.MetricRetries, metricHeapInuse}, goMemGauges...)...)
	if err != nil {
		return extenderScrape{}, fmt.Errorf("%s: %w", url, err)
	}
	out := extenderScrape{durations: map[string]histogram{}, binds: map[string]float64{}}
	for _, m := range families[extender.MetricRequestDuration].GetMetric() {
		var h histogram
		for _, b := range m.GetHistogram().GetBucket() {
			h.bounds = append(h.bounds, b.GetUpperBound())
			h.counts = append(h.counts, float64(b.GetCumulativeCount()))
		}
		if len(h.bounds) == 0 || !math.IsInf(h.bounds[len(h.bounds)-1], 1) {
			h.bounds = append(h.bounds, math.Inf(1))
			h.counts = append(h.counts, float64(m.GetHistogram().GetSampleCount()))
		}
		out.durations[labels(m)["verb"]] = h
	}
	for _, m := range families[extender.MetricBinds].GetMetric() {
		out.binds[labels(m)["result"]] = m.GetCounter().GetValue()
	}
	out.gpus = len(families[extender.MetricGPUMemorySchedulable].GetMetric())
	for _, m := range families[extender.MetricRetries].GetMetric() {
		out.retries += m.GetCounter().GetValue()
	}
	for _, m := range families[metricHeapInuse].GetMetric() {
		out.heapInuseBytes = m.GetGauge().GetValue()
	}
	out.goMemory = map[string]float64{}
	for _, name := range goMemGauges {
		for _, m := range families[name].GetMetric() {
			out.goMemory[name] = m.GetGauge().GetValue()
		}
	}
	return out, nil
}

// sub returns h − before bucket by bucket: the observations made in between. A before with
// other bounds (a restarted extender) counts as empty.
func (h histogram) sub(before histogram) histogram {
	out := histogram{bounds: h.bounds, counts: append([]float64(nil), h.counts...)}
	if len(before.counts) != len(h.counts) {
		return out
	}
	for i := range out.counts {
		out.counts[i] -= before.counts[i]
	}
	return out
}

// count is the number of observations.
func (h histogram) count() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// quantile estimates the q-quantile (0 < q < 1) as Prometheus's histogram_quantile does: find
// the bucket holding rank q × count and interpolate linearly inside it (from 0 for the first
// bucket). It returns NaN without observations, and the highest finite bound when the rank
// falls in the +Inf bucket.
func (h histogram) quantile(q float64) float64 {
	total := h.count()
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	for i, c := range h.counts {
		if c < rank {
			continue
		}
		if math.IsInf(h.bounds[i], 1) {
			if i == 0 {
				return math.NaN()
			}
			return h.bounds[i-1]
		}
		lower, below := 0.0, 0.0
		if i > 0 {
			lower, below = h.bounds[i-1], h.counts[i-1]
		}
		if c == below {
			return h.bounds[i]
		}
		return lower + (h.bounds[i]-lower)*(rank-below)/(c-below)
	}
	return h.bounds[len(h.bounds)-1]
}

// parseMetrics parses the families called names out of the Prometheus text format in r. Lines
// of other families are dropped before parsing: the extender exports four series per GPU, and
// parsing 160,000 of them at 5,000 nodes would cost the harness seconds of CPU per scrape.
func parseMetrics(r io.Reader, names ...string) (map[string]*dto.MetricFamily, error) {
	var kept bytes.Buffer
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		name := line
		if rest, ok := bytes.CutPrefix(line, []byte("# ")); ok {
			if f := bytes.Fields(rest); len(f) >= 2 {
				name = f[1]
			}
		}
		if i := bytes.IndexAny(name, "{ "); i >= 0 {
			name = name[:i]
		}
		if wanted(string(name), names) {
			kept.Write(line)
			kept.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(&kept)
	if err != nil {
		return nil, fmt.Errorf("not the Prometheus text format: %w", err)
	}
	return families, nil
}

// wanted reports whether sample or family name belongs to one of the families names: the name
// itself or a histogram's _bucket, _sum or _count series.
func wanted(name string, names []string) bool {
	for _, n := range names {
		switch name {
		case n, n + "_bucket", n + "_sum", n + "_count":
			return true
		}
	}
	return false
}

// labels returns m's labels by name.
func labels(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// formatSeconds renders a duration in seconds for tables: "0.84ms", "73ms", "1.2s", "-" for NaN.
func formatSeconds(s float64) string {
	switch {
	case math.IsNaN(s):
		return "-"
	case s < 0.01:
		return fmt.Sprintf("%.2fms", s*1000)
	case s < 1:
		return fmt.Sprintf("%.0fms", s*1000)
	}
	return fmt.Sprintf("%.2fs", s)
}

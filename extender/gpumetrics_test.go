package extender

import (
	"bufio"
	"bytes"
	"net/http"
	"net/http/httptest"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpuslice/gpuslice/internal/metricstest"
	"github.com/gpuslice/gpuslice/vgpu"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

// registryGPUs is the per-GPU gauges as a prometheus.Collector of constant
// metrics: how the extender served them before metricsHandler, kept as the
// reference the streamed families must equal and as the baseline of
// BenchmarkScrape.
type registryGPUs struct {
	samples func() []cluster.GPUSample
	descs   []*prometheus.Desc
}

func newRegistryGPUs(samples func() []cluster.GPUSample) *registryGPUs {
	r := &registryGPUs{samples: samples}
	for _, f := range gpuFamilies {
		r.descs = append(r.descs, prometheus.NewDesc(f.name, f.help, []string{"node", "gpu"}, nil))
	}
	return r
}

func (r *registryGPUs) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range r.descs {
		ch <- d
	}
}

func (r *registryGPUs) Collect(ch chan<- prometheus.Metric) {
	for _, g := range r.samples() {
		for i, f := range gpuFamilies {
			ch <- constMetric(r.descs[i], prometheus.GaugeValue, float64(f.value(&g)), g.Node, g.GPU)
		}
	}
}

// parseText parses a scrape in the text format into its families.
func parseText(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("not the Prometheus text format: %v\n%s", err, body)
	}
	return families
}

// familyHeads is each family's help and type.
func familyHeads(families map[string]*dto.MetricFamily) map[string]string {
	out := map[string]string{}
	for name, f := range families {
		out[name] = f.GetType().String() + " " + f.GetHelp()
	}
	return out
}

// TestGPUFamiliesAsTheRegistryWritesThem checks that the per-GPU gauges
// written line by line parse to exactly the families, help, types, series
// and values a Prometheus registry writes for the same figures, label
// values that need escaping included.
func TestGPUFamiliesAsTheRegistryWritesThem(t *testing.T) {
	samples := []cluster.GPUSample{
		{Node: "node-a", GPU: "GPU-0", MemoryMiB: 4096, CoresPercent: 30, Slices: 2, SchedulableMemMiB: 81920},
		{Node: "node-a", GPU: "GPU-1", SchedulableMemMiB: 81920},
		{Node: "node-b", GPU: `GPU-"quoted"\back` + "\nline", MemoryMiB: 1, CoresPercent: 100, Slices: 1, SchedulableMemMiB: 15360},
		{Node: "node-c", GPU: "GPU-ü", MemoryMiB: 1 << 40, SchedulableMemMiB: 1 << 40},
	}
	var streamed bytes.Buffer
	bw := bufio.NewWriter(&streamed)
	if err := writeGPUFamilies(bw, samples); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newRegistryGPUs(func() []cluster.GPUSample { return samples }))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	want := metricstest.Scrape(t, nil, srv.URL)
	got := parseText(t, streamed.Bytes())
	if diff := cmp.Diff(want, sampleMap(got)); diff != "" {
		t.Errorf("series (-registry +streamed):\n%s", diff)
	}
	wantFamilies, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	wantHeads := map[string]string{}
	for _, f := range wantFamilies {
		wantHeads[f.GetName()] = f.GetType().String() + " " + f.GetHelp()
	}
	if diff := cmp.Diff(wantHeads, familyHeads(got)); diff != "" {
		t.Errorf("help and type (-registry +streamed):\n%s", diff)
	}
}

// sampleMap is metricstest.Scrape's map of parsed families (gauges only).
func sampleMap(families map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName(), l.GetValue())
			}
			out[metricstest.Series(name, labels...)] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TestGPUFamiliesInvalidUTF8 checks that a GPU UUID that is not UTF-8 (the
// inventory is whatever a node wrote) still gives a scrape that parses,
// with the invalid bytes replaced.
func TestGPUFamiliesInvalidUTF8(t *testing.T) {
	var buf bytes.Buffer
	bw := bufio.NewWriter(&buf)
	if err := writeGPUFamilies(bw, []cluster.GPUSample{{Node: "n", GPU: "GPU-\xff\xfe", Slices: 3}}); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	got := sampleMap(parseText(t, buf.Bytes()))
	if v, ok := got[metricstest.Series(MetricGPUSlicesAllocated, "gpu", "GPU-\uFFFD", "node", "n")]; !ok || v != 3 {
		t.Errorf("slices of the GPU with an invalid UUID: %v (present %v), want 3 under GPU-\\uFFFD; got %v", v, ok, got)
	}
}

func TestAcceptsGzip(t *testing.T) {
	for header, want := range map[string]bool{
		"":                           false,
		"gzip":                       true,
		"GZIP":                       true,
		"deflate, gzip;q=1.0, *;q=0": true,
		"gzip;q=0":                   false,
		"gzip; q=0.000":              false,
		"gzip;q=0.5":                 true,
		"identity":                   false,
		"x-gzip":                     false,
	} {
		if got := acceptsGzip(header); got != want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", header, got, want)
		}
	}
}

// TestMetricsScrapeGzip checks /metrics with and without gzip: the same
// series either way (the Go runtime's aside, which move between scrapes),
// and gzip only when asked for.
func TestMetricsScrapeGzip(t *testing.T) {
	_, n1 := gpuNode("n1", 2, 16384)
	e := newEnv(t, testConfig(), n1...)
	var bodies []map[string]float64
	for _, enc := range []string{"", "gzip"} {
		tr := &http.Transport{DisableCompression: enc == ""}
		defer tr.CloseIdleConnections()
		scrape := metricstest.Scrape(t, &http.Client{Transport: tr}, e.srv.URL+"/metrics")
		bodies = append(bodies, metricstest.Pick(scrape, MetricBinds, MetricGPUMemoryAllocated, MetricGPUCoresAllocated, MetricGPUSlicesAllocated, MetricGPUMemorySchedulable))
	}
	if diff := cmp.Diff(bodies[0], bodies[1]); diff != "" {
		t.Errorf("scrape without gzip (-) and with (+):\n%s", diff)
	}
	if v, ok := bodies[0][metricstest.Series(MetricGPUMemorySchedulable, "gpu", "n1-GPU-1", "node", "n1")]; !ok || v != 16384 {
		t.Errorf("schedulable memory of n1-GPU-1: %v (present %v), want 16384", v, ok)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, e.srv.URL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if got := resp.Header.Get("Content-Encoding"); got != "gzip" {
		t.Errorf("Content-Encoding with Accept-Encoding: gzip = %q, want gzip", got)
	}
}

// BenchmarkScrape is one GET /metrics of an extender that knows 5,000
// nodes of 8 GPUs holding 40,000 slices (160,000 per-GPU series), written
// to a connection that discards it: the extender's metricsHandler against
// the baseline of the same figures as constant metrics of a registry,
// served by promhttp, measured in the same run. It reports p50 per scrape
// in ms, MiB allocated per scrape and the ratios.
func BenchmarkScrape(b *testing.B) {
	s, _ := benchScheduler(b, 5000, 40000, vgpu.PolicyBinpack)
	reg := prometheus.NewRegistry()
	reg.MustRegister(newRegistryGPUs(s.state.GPUSamples))
	baseline := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	measure := func(h http.Handler, n int) (p50 time.Duration, mib float64) {
		var took []time.Duration
		var before, after goruntime.MemStats
		goruntime.ReadMemStats(&before)
		for range n {
			w := &discardWriter{header: http.Header{}}
			start := time.Now()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			took = append(took, time.Since(start))
			if w.code != 0 && w.code != http.StatusOK {
				b.Fatalf("scrape: HTTP %d", w.code)
			}
		}
		goruntime.ReadMemStats(&after)
		slices.Sort(took)
		return took[len(took)/2], float64(after.TotalAlloc-before.TotalAlloc) / float64(n) / (1 << 20)
	}
	baseP50, baseMiB := measure(baseline, 5)
	var p50 time.Duration
	var mib float64
	for b.Loop() {
		p50, mib = measure(s.metrics.handler, 5)
	}
	b.ReportMetric(ms(p50), "p50-ms")
	b.ReportMetric(mib, "MiB/scrape")
	b.ReportMetric(ms(baseP50), "baseline-p50-ms")
	b.ReportMetric(baseMiB, "baseline-MiB/scrape")
	b.ReportMetric(float64(p50)/float64(baseP50), "x-baseline-time")
	b.ReportMetric(mib/baseMiB, "x-baseline-MiB")
}

// discardWriter is a ResponseWriter that counts and drops the body.
type discardWriter struct {
	header http.Header
	code   int
	n      int
}

func (d *discardWriter) Header() http.Header { return d.header }

func (d *discardWriter) Write(p []byte) (int, error) {
	d.n += len(p)
	return len(p), nil
}

func (d *discardWriter) WriteHeader(code int) { d.code = code }

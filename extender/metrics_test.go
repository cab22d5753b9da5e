package extender

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuslice/gpuslice/internal/metricstest"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestMetrics drives filter and bind through HTTP, then scrapes /metrics
// and checks the request counters, the bind results, the rejections by
// reason and the per-GPU gauges computed from the state.
func TestMetrics(t *testing.T) {
	_, n1 := gpuNode("n1", 1, 16384)
	// n2 publishes an inventory but has no heartbeat Lease: not ready, yet
	// its GPU is in the gauges.
	n2 := vgputest.PublishedNode(vgputest.Node("n2").GPU("n2-GPU-0", 24576).Schedulable("n2-GPU-0", 20000).Obj()).Obj()
	e := newEnv(t, testConfig(), append(n1, n2)...)

	small, big := slicePod("small", 4096), slicePod("big", 15000)
	e.createPod(small)
	e.createPod(big)
	if got := e.filter(small, "n1", "n2", "ghost"); len(*got.NodeNames) != 1 {
		t.Fatalf("filter small: passed %v, want n1 only", *got.NodeNames)
	}
	if got := e.bind(small, "n1"); got.Error != "" {
		t.Fatalf("bind small: %s", got.Error)
	}
	e.settled()
	if got := e.filter(big, "n1"); len(*got.NodeNames) != 0 {
		t.Fatalf("filter big: passed %v, want none", *got.NodeNames)
	}
	if got := e.bind(big, "n1"); got.Error == "" {
		t.Fatal("bind big: no error, want one (the pod does not fit)")
	}
	gone := vgputest.Pod("gone").Container("main").GPU(1).Obj() // never created
	if got := e.bind(gone, "n1"); got.Error == "" {
		t.Fatal("bind of a missing pod: no error")
	}
	if code, _ := postRaw(t, e.srv.URL+"/filter", "application/json", []byte("{}"), nil); code != http.StatusBadRequest {
		t.Fatalf("/filter {}: HTTP %d, want 400", code)
	}
	e.prioritize(small, "n1")

	got := metricstest.Pick(metricstest.Scrape(t, nil, e.srv.URL+"/metrics"),
		MetricRequests, MetricRequestDuration+"_count", MetricBinds, MetricBindsInDoubt, MetricFilterRejections,
		MetricGPUMemoryAllocated, MetricGPUCoresAllocated, MetricGPUSlicesAllocated, MetricGPUMemorySchedulable)
	want := map[string]float64{
		`gpuslice_extender_requests_total{code="200",verb="filter"}`:              2,
		`gpuslice_extender_requests_total{code="400",verb="filter"}`:              1,
		`gpuslice_extender_requests_total{code="200",verb="bind"}`:                3,
		`gpuslice_extender_requests_total{code="200",verb="prioritize"}`:          1,
		`gpuslice_extender_request_duration_seconds_count{verb="filter"}`:         3,
		`gpuslice_extender_request_duration_seconds_count{verb="bind"}`:           3,
		`gpuslice_extender_request_duration_seconds_count{verb="prioritize"}`:     1,
		`gpuslice_extender_request_duration_seconds_count{verb="dra/prioritize"}`: 0,
		`gpuslice_extender_binds_total{result="success"}`:                         1,
		`gpuslice_extender_binds_total{result="unfit"}`:                           1,
		`gpuslice_extender_binds_total{result="error"}`:                           1,
		`gpuslice_extender_binds_total{result="overloaded"}`:                      0,
		`gpuslice_extender_binds_total{result="not_synced"}`:                      0,
		`gpuslice_extender_binds_total{result="in_doubt"}`:                        0,
		`gpuslice_extender_binds_in_doubt`:                                        0,
		`gpuslice_extender_filter_rejections_total{reason="NoHeartbeat"}`:         1,
		`gpuslice_extender_filter_rejections_total{reason="NodeUnknown"}`:         1,
		`gpuslice_extender_filter_rejections_total{reason="InsufficientMemory"}`:  1,
		`gpuslice_gpu_memory_allocated_mib{gpu="n1-GPU-0",node="n1"}`:             4096,
		`gpuslice_gpu_memory_allocated_mib{gpu="n2-GPU-0",node="n2"}`:             0,
		`gpuslice_gpu_cores_allocated_percent{gpu="n1-GPU-0",node="n1"}`:          10,
		`gpuslice_gpu_cores_allocated_percent{gpu="n2-GPU-0",node="n2"}`:          0,
		`gpuslice_gpu_slices_allocated{gpu="n1-GPU-0",node="n1"}`:                 1,
		`gpuslice_gpu_slices_allocated{gpu="n2-GPU-0",node="n2"}`:                 0,
		`gpuslice_gpu_memory_schedulable_mib{gpu="n1-GPU-0",node="n1"}`:           16384,
		`gpuslice_gpu_memory_schedulable_mib{gpu="n2-GPU-0",node="n2"}`:           20000,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	wantRejections := map[vgpu.Reason]int64{ReasonNoHeartbeat: 1, ReasonNodeUnknown: 1, vgpu.ReasonInsufficientMemory: 1}
	if diff := cmp.Diff(wantRejections, e.s.Rejections()); diff != "" {
		t.Errorf("Rejections (-want +got):\n%s", diff)
	}

	// A deleted pod frees its slice; the gauges follow at the next scrape.
	if err := e.client.CoreV1().Pods(small.Namespace).Delete(context.Background(), small.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the slice freed in the gauges", func() bool {
		s := metricstest.Scrape(t, nil, e.srv.URL+"/metrics")
		return s[`gpuslice_gpu_slices_allocated{gpu="n1-GPU-0",node="n1"}`] == 0 &&
			s[`gpuslice_gpu_memory_allocated_mib{gpu="n1-GPU-0",node="n1"}`] == 0
	})
}

// TestMetricsRegistry checks Options.Registry: the extender's metrics land
// in the given registry, with no Go or process collectors added, and a
// second Scheduler on the same registry is refused rather than sharing it.
func TestMetricsRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(testConfig(), Options{Client: fake.NewClientset(), Registry: reg}); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	// Only the bind results, the plain counters, the binds in doubt, the
	// leader gauge, the pending pods (one series per reason) and the
	// request durations (one histogram per verb) start at 0; the other
	// vectors appear with their first sample.
	if diff := cmp.Diff([]string{MetricBindPodReads, MetricBindsInDoubt, MetricBinds, MetricLeader, MetricPendingOldestSecond, MetricPendingPods, MetricRequestDuration, MetricRetries, MetricStaleReleased}, names); diff != "" {
		t.Errorf("metric families before any request (-want +got):\n%s", diff)
	}
	_, err = New(testConfig(), Options{Client: fake.NewClientset(), Registry: reg})
	var already prometheus.AlreadyRegisteredError
	if !errors.As(err, &already) {
		t.Errorf("second New on the same registry: %v, want an AlreadyRegisteredError", err)
	}
}

// TestMetricsOnHealthAddress checks that /metrics is served on the health
// listener too, where Prometheus scrapes it in the chart, with the Go
// runtime metrics of the default registry.
func TestMetricsOnHealthAddress(t *testing.T) {
	srv := serveWithHealth(t)
	if code, _ := postRaw(t, srv.api+"/filter", "application/json", []byte("{}"), nil); code != http.StatusBadRequest {
		t.Fatalf("/filter on the API address: HTTP %d, want 400", code)
	}
	for _, base := range []string{srv.health, srv.api} {
		got := metricstest.Scrape(t, nil, base+"/metrics")
		if v := got[`gpuslice_extender_requests_total{code="400",verb="filter"}`]; v != 1 {
			t.Errorf("%s/metrics: filter 400 count %v, want 1", base, v)
		}
		if _, ok := got["go_goroutines"]; !ok {
			t.Errorf("%s/metrics: no go_goroutines", base)
		}
	}
}

// getNoFail GETs url and returns the status, or -1 when it cannot connect.
func getNoFail(url string) (int, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		return -1, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

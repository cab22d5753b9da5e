package deviceplugin

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/status"

	"github.com/gpuslice/gpuslice/internal/registry"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Metric names the plugin exposes on GET /metrics of ProbeHandler;
// docs/metrics.md describes each one.
const (
	MetricRegistrations = "gpuslice_deviceplugin_registrations_total"
	MetricRegistered    = "gpuslice_deviceplugin_registered"
	MetricGPUHealthy    = "gpuslice_deviceplugin_gpu_healthy"
	MetricPreStart      = "gpuslice_deviceplugin_prestart_total"
	MetricAllocate      = "gpuslice_deviceplugin_allocate_total"
	MetricCallDuration  = "gpuslice_deviceplugin_call_duration_seconds"
	MetricSpecWrites    = "gpuslice_deviceplugin_cdi_spec_writes_total"
)

// Values of MetricCallDuration's call label: the kubelet's calls of the
// hand-off.
const (
	CallGetPreferredAllocation = "GetPreferredAllocation"
	CallAllocate               = "Allocate"
	CallPreStartContainer      = "PreStartContainer"
)

// HandoffCalls returns every value of MetricCallDuration's call label.
func HandoffCalls() []string {
	return []string{CallGetPreferredAllocation, CallAllocate, CallPreStartContainer}
}

// callBuckets are MetricCallDuration's buckets, in seconds: the kubelet
// admits a node's pods one at a time and waits for GetPreferredAllocation
// and Allocate, so milliseconds matter there; PreStartContainer may wait up
// to its 25 s budget.
var callBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25}

// Values of the result label. A failed Allocate or PreStartContainer is
// labelled with its reason instead of ResultFailure: for a refused start,
// the Warning event's reason (ReasonAllocationMissing, …); otherwise the
// gRPC status code of the error the kubelet gets (InvalidArgument,
// FailedPrecondition, Unavailable, Internal, …).
const (
	ResultSuccess = "success"
	// ResultFailure labels a Register call the kubelet refused, that
	// timed out, or that the plugin cut short because its socket vanished.
	ResultFailure = "failure"
)

// pluginMetrics are the plugin's Prometheus metrics; safe for concurrent
// use. A nil *pluginMetrics counts nothing, for allocators built in tests.
type pluginMetrics struct {
	// set is every collector registered, for MetricNames.
	set           registry.Set
	handler       http.Handler
	registrations *prometheus.CounterVec
	preStarts     *prometheus.CounterVec
	allocates     *prometheus.CounterVec
	calls         *prometheus.HistogramVec
	specWrites    *prometheus.CounterVec
}

// newPluginMetrics registers p's metrics in reg; a nil reg is a new
// registry with the Go runtime and process collectors.
func newPluginMetrics(p *Plugin, reg *prometheus.Registry) (*pluginMetrics, error) {
	if reg == nil {
		var err error
		if reg, err = registry.New(); err != nil {
			return nil, fmt.Errorf("deviceplugin: %w", err)
		}
	}
	m := &pluginMetrics{
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRegistrations,
			Help: "Register calls to the kubelet, by result: success or failure.",
		}, []string{"result"}),
		preStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPreStart,
			Help: "PreStartContainer calls (every container start), by result: success, the refusal's event reason, or the gRPC code of the error.",
		}, []string{"result"}),
		allocates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricAllocate,
			Help: "Allocate calls (once per container at admission), by result: success or the gRPC code of the error.",
		}, []string{"result"}),
		calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricCallDuration,
			Help:    "Time the plugin took to answer the kubelet's hand-off calls, by call: GetPreferredAllocation and Allocate (the kubelet waits for both while it admits a pod, one pod at a time) and PreStartContainer (every container start).",
			Buckets: callBuckets,
		}, []string{"call"}),
		specWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricSpecWrites,
			Help: "CDI spec files written (mode cdi), by the call that wrote them: Allocate (prepared in the background for the container the kubelet admits) or PreStartContainer (a start found no spec, or another one, under the container's CDI device name).",
		}, []string{"call"}),
	}
	for _, call := range HandoffCalls() {
		m.calls.WithLabelValues(call)
	}
	m.specWrites.WithLabelValues(CallAllocate)
	m.specWrites.WithLabelValues(CallPreStartContainer)
	m.registrations.WithLabelValues(ResultSuccess)
	m.registrations.WithLabelValues(ResultFailure)
	m.preStarts.WithLabelValues(ResultSuccess)
	m.allocates.WithLabelValues(ResultSuccess)
	registered := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: MetricRegistered,
		Help: "1 while the kubelet has accepted the plugin's current registration, else 0.",
	}, func() float64 {
		if p.Registered() {
			return 1
		}
		return 0
	})
	set, err := registry.Register(reg, m.registrations, m.preStarts, m.allocates, m.calls, m.specWrites, registered, &healthCollector{p: p}, &gpuCollector{p: p})
	if err != nil {
		return nil, fmt.Errorf("deviceplugin: metrics: %w", err)
	}
	m.set = set
	return m, nil
}

// MetricNames returns the names of the metrics the plugin exports on
// /metrics (beside the Go runtime and process metrics), from its
// registered collectors.
func (p *Plugin) MetricNames() []string { return p.metrics.set.Names() }

// registration counts one Register call; err is its outcome.
func (m *pluginMetrics) registration(err error) {
	if m == nil {
		return
	}
	result := ResultSuccess
	if err != nil {
		result = ResultFailure
	}
	m.registrations.WithLabelValues(result).Inc()
}

// allocated counts one Allocate call answered with err.
func (m *pluginMetrics) allocated(err error) {
	if m != nil {
		m.allocates.WithLabelValues(resultOf(err)).Inc()
	}
}

// preStarted counts one PreStartContainer call with its result label.
func (m *pluginMetrics) preStarted(result string) {
	if m != nil {
		m.preStarts.WithLabelValues(result).Inc()
	}
}

// specWritten counts one CDI spec file written by call.
func (m *pluginMetrics) specWritten(call string) {
	if m != nil {
		m.specWrites.WithLabelValues(call).Inc()
	}
}

// took records that the hand-off call took d to answer.
func (m *pluginMetrics) took(call string, d time.Duration) {
	if m != nil {
		m.calls.WithLabelValues(call).Observe(d.Seconds())
	}
}

// resultOf is the result label of a call that returned err: success, the
// reason of a *refusal, or the gRPC code of err.
func resultOf(err error) string {
	if err == nil {
		return ResultSuccess
	}
	var r *refusal
	if errors.As(err, &r) {
		return r.Reason
	}
	return status.Code(err).String()
}

var gpuHealthyDesc = prometheus.NewDesc(MetricGPUHealthy,
	"1 while the advertised GPU is healthy, 0 while a device fault keeps it unhealthy (its slices are then unhealthy devices for the kubelet). No series before Run has listed the GPUs.",
	[]string{"gpu"}, nil)

// healthCollector reads the GPUs' health from the running plugin's
// inventory at scrape time.
type healthCollector struct {
	p *Plugin
}

// Describe implements prometheus.Collector.
func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- gpuHealthyDesc }

// Collect implements prometheus.Collector.
func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	inv := c.p.inv.Load()
	if inv == nil {
		return
	}
	node, _, _ := inv.snapshot()
	for _, g := range node.GPUs {
		v := 0.0
		if g.Health == vgpu.Healthy {
			v = 1
		}
		m, err := prometheus.NewConstMetric(gpuHealthyDesc, prometheus.GaugeValue, v, g.UUID)
		if err != nil {
			m = prometheus.NewInvalidMetric(gpuHealthyDesc, err)
		}
		ch <- m
	}
}

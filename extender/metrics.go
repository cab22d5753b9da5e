package extender

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuslice/gpuslice/internal/registry"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Metric names the extender exposes on GET /metrics; docs/metrics.md
// describes each one.
const (
	MetricRequests             = "gpuslice_extender_requests_total"
	MetricRequestDuration      = "gpuslice_extender_request_duration_seconds"
	MetricFilterRejections     = "gpuslice_extender_filter_rejections_total"
	MetricBinds                = "gpuslice_extender_binds_total"
	MetricRetries              = "gpuslice_extender_scheduler_retries_total"
	MetricBindPodReads         = "gpuslice_extender_bind_pod_reads_total"
	MetricStaleReleased        = "gpuslice_extender_stale_reservations_released_total"
	MetricBindsInDoubt         = "gpuslice_extender_binds_in_doubt"
	MetricGPUMemoryAllocated   = "gpuslice_gpu_memory_allocated_mib"
	MetricGPUCoresAllocated    = "gpuslice_gpu_cores_allocated_percent"
	MetricGPUSlicesAllocated   = "gpuslice_gpu_slices_allocated"
	MetricGPUMemorySchedulable = "gpuslice_gpu_memory_schedulable_mib"
	MetricNodeUnregistered     = "gpuslice_extender_node_unregistered"
	MetricLeader               = "gpuslice_extender_leader"
)

// Values of the result label of MetricBinds.
const (
	// BindSuccess: the pod is bound, with its allocation when it asks for
	// GPUs.
	BindSuccess = "success"
	// BindUnfit: the pod no longer fits the node kube-scheduler chose
	// (the state changed since Filter, or another bind took the room).
	BindUnfit = "unfit"
	// BindOverloaded: refused at once because Config.MaxPendingBinds
	// binds were already waiting for the API client.
	BindOverloaded = "overloaded"
	// BindNotSynced: refused because the informers had not synced yet.
	BindNotSynced = "not_synced"
	// BindInDoubt: the Binding's outcome is unknown and the pod was not
	// bound yet; its GPUs stay reserved until that is settled (a retry of
	// such a pod counts here too).
	BindInDoubt = "in_doubt"
	// BindError: any other failure: the pod changed or went, an API
	// request failed or timed out, the pod's request is invalid.
	BindError = "error"
)

// reasonUnknown labels a rejection whose reason is empty (an error of
// vgpu.Fit that is not a *vgpu.FitError).
const reasonUnknown = "Unknown"

// verbs are the endpoints counted by MetricRequests, by path.
var verbs = []string{"filter", "prioritize", "bind", "dra/prioritize"}

// durationBuckets span Filter over one node (well below a millisecond) to
// a Bind that waits out Config.BindTimeout.
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// metrics are the Scheduler's Prometheus metrics; they are registered once,
// in New, and safe for concurrent use.
type metrics struct {
	// set is every collector registered, for MetricNames.
	set registry.Set
	// handler serves the registry in the Prometheus exposition formats.
	handler http.Handler
	// requests and durations are curried per verb.
	requests  map[string]*prometheus.CounterVec
	durations map[string]prometheus.ObserverVec
	binds     *prometheus.CounterVec
	retries   prometheus.Counter
	// bindPodReads counts the pods Bind read from the API server because
	// the informers had not seen them yet.
	bindPodReads prometheus.Counter
	// staleReleased counts the bound pods confirmBinds found gone.
	staleReleased prometheus.Counter
	// leader is 1 while the instance runs the leader's loops (lead).
	leader prometheus.Gauge
}

// newMetrics registers the Scheduler's metrics in reg; a nil reg is a new
// registry with the Go runtime and process collectors.
func newMetrics(s *Scheduler, reg *prometheus.Registry) (*metrics, error) {
	if reg == nil {
		var err error
		if reg, err = registry.New(); err != nil {
			return nil, fmt.Errorf("extender: %w", err)
		}
	}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricRequests,
		Help: "HTTP requests to the extender's filter, prioritize and bind endpoints, by verb and HTTP status code.",
	}, []string{"verb", "code"})
	durations := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    MetricRequestDuration,
		Help:    "Time to answer kube-scheduler's filter, prioritize and bind requests, from the request headers to the last byte written, by verb.",
		Buckets: durationBuckets,
	}, []string{"verb"})
	binds := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricBinds,
		Help: "Bind calls by result: success, unfit (the pod no longer fits the chosen node), overloaded (refused at once: maxPendingBinds binds were waiting), not_synced (refused: informers not synced), in_doubt (the Binding's outcome is unknown and the pod not bound yet: its GPUs stay reserved) or error.",
	}, []string{"result"})
	for _, r := range []string{BindSuccess, BindUnfit, BindOverloaded, BindNotSynced, BindInDoubt, BindError} {
		binds.WithLabelValues(r)
	}
	retries := prometheus.NewCounter(prometheus.CounterOpts{
		Name: MetricRetries,
		Help: "Pods the extender asked kube-scheduler to try again (annotation " + AnnotationRetry + ") because Filter turned them away before it saw a change that may let them fit.",
	})
	bindPodReads := prometheus.NewCounter(prometheus.CounterOpts{
		Name: MetricBindPodReads,
		Help: "Pods Bind read from the API server because the informers' cache had not seen them yet (normally Bind reads none).",
	})
	staleReleased := prometheus.NewCounter(prometheus.CounterOpts{
		Name: MetricStaleReleased,
		Help: "Pods bound by the extender that its informers never saw and that the API server no longer had running when read " + confirmGrace.String() + " later; what they held was released (each is a watch gap that lost a deletion).",
	})
	inDoubt := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: MetricBindsInDoubt,
		Help: "Pods whose Binding had an unknown outcome and that were not seen bound yet: their GPUs stay reserved until the API server shows them bound or gone, or still unbound after bindOutcomeWait.",
	}, func() float64 { return float64(s.bindsInDoubt()) })
	leader := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricLeader,
		Help: "1 while this extender instance asks kube-scheduler for retries and maintains the nodes' registration conditions: always once synced without leaderLease, else while kube-scheduler's leader Lease names the kube-scheduler beside it; 0 otherwise.",
	})
	m := &metrics{
		leader:        leader,
		bindPodReads:  bindPodReads,
		staleReleased: staleReleased,
		handler:       &metricsHandler{reg: reg, st: s.state},
		retries:       retries,
		requests:      map[string]*prometheus.CounterVec{},
		durations:     map[string]prometheus.ObserverVec{},
		binds:         binds,
	}
	for _, verb := range verbs {
		c, err := requests.CurryWith(prometheus.Labels{"verb": verb})
		if err != nil {
			return nil, fmt.Errorf("extender: metrics: %w", err)
		}
		d, err := durations.CurryWith(prometheus.Labels{"verb": verb})
		if err != nil {
			return nil, fmt.Errorf("extender: metrics: %w", err)
		}
		m.requests[verb], m.durations[verb] = c, d
		// Each verb's histogram exists from the start, so that rate() sees the first
		// requests after a restart (a series born with them starts at their count).
		durations.WithLabelValues(verb)
	}
	set, err := registry.Register(reg, requests, durations, binds, retries, leader, bindPodReads, staleReleased, inDoubt, &stateCollector{s: s}, &registrationCollector{s: s}, &pendingCollector{s: s})
	if err != nil {
		return nil, fmt.Errorf("extender: metrics: %w", err)
	}
	m.set = set
	return m, nil
}

// MetricNames returns the names of the metrics the extender exports on
// /metrics (beside the Go runtime and process metrics), from its
// registered collectors and gpuFamilies.
func (s *Scheduler) MetricNames() []string {
	names := s.metrics.set.Names()
	for _, f := range gpuFamilies {
		names = append(names, f.name)
	}
	slices.Sort(names)
	return names
}

// instrument counts and times the requests h answers for verb.
func (m *metrics) instrument(verb string, h http.Handler) http.Handler {
	return promhttp.InstrumentHandlerDuration(m.durations[verb], promhttp.InstrumentHandlerCounter(m.requests[verb], h))
}

// bindResult counts one Bind by its outcome: err is what bind returned.
func (m *metrics) bindResult(err error) {
	var fe *vgpu.FitError
	switch {
	case err == nil:
		m.binds.WithLabelValues(BindSuccess).Inc()
	case errors.As(err, &fe):
		m.binds.WithLabelValues(BindUnfit).Inc()
	case errors.Is(err, ErrOverloaded):
		m.binds.WithLabelValues(BindOverloaded).Inc()
	case errors.Is(err, errNotSyncedBind):
		m.binds.WithLabelValues(BindNotSynced).Inc()
	case errors.Is(err, ErrBindInDoubt):
		m.binds.WithLabelValues(BindInDoubt).Inc()
	default:
		m.binds.WithLabelValues(BindError).Inc()
	}
}

// rejectionsDesc describes the counters stateCollector computes at scrape
// time.
var rejectionsDesc = prometheus.NewDesc(MetricFilterRejections,
	"Nodes Filter turned away since the extender started, by reason: vgpu's Fit reasons and the extender's readiness reasons (Scheduler.Rejections).",
	[]string{"reason"}, nil)

// stateCollector computes the rejection counters from the Scheduler's
// in-memory state when Prometheus scrapes; it makes no API call. The
// per-GPU gauges are written by metricsHandler.
type stateCollector struct {
	s *Scheduler
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rejectionsDesc
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for reason, n := range c.s.Rejections() {
		label := string(reason)
		if label == "" {
			label = reasonUnknown
		}
		ch <- constMetric(rejectionsDesc, prometheus.CounterValue, float64(n), label)
	}
}

// constMetric is a constant sample, or an invalid metric that makes the
// scrape report the error (never a panic).
func constMetric(desc *prometheus.Desc, kind prometheus.ValueType, v float64, labels ...string) prometheus.Metric {
	m, err := prometheus.NewConstMetric(desc, kind, v, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(desc, err)
	}
	return m
}

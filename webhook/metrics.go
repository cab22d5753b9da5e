package webhook

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuslice/gpuslice/internal/probe"
	"github.com/gpuslice/gpuslice/internal/registry"
)

// MetricsPath answers GET with the webhook's Prometheus metrics
// (docs/metrics.md).
const MetricsPath = probe.MetricsPath

// Metric names the webhook exposes on MetricsPath.
const (
	MetricAdmissions        = "gpuslice_webhook_admissions_total"
	MetricAdmissionDuration = "gpuslice_webhook_admission_duration_seconds"
	MetricInvalidRequests   = "gpuslice_webhook_invalid_requests_total"
)

// Decision is the decision label of MetricAdmissions: what the webhook
// answered to one AdmissionReview.
type Decision string

// The decisions.
const (
	// DecisionPatched: allowed with a JSON patch.
	DecisionPatched Decision = "patched"
	// DecisionAllowed: allowed unchanged.
	DecisionAllowed Decision = "allowed"
	// DecisionDenied: rejected; the pod is not created.
	DecisionDenied Decision = "denied"
)

// AdmissionReason is the reason label of MetricAdmissions: why the webhook
// decided as it did. Each reason belongs to one Decision.
type AdmissionReason string

// The reasons, by decision.
const (
	// ReasonGPUPod (patched): a GPU pod steered to the gpuslice scheduler
	// profile or given defaults.
	ReasonGPUPod AdmissionReason = "GPUPod"
	// ReasonGPUPodUnchanged (allowed): a valid GPU pod that needs no
	// change.
	ReasonGPUPodUnchanged AdmissionReason = "GPUPodUnchanged"
	// ReasonNotGPUPod (allowed): a pod that asks for no hami.io resource.
	ReasonNotGPUPod AdmissionReason = "NotGPUPod"
	// ReasonExcludedNamespace (allowed): a pod in Config.ExcludedNamespaces.
	ReasonExcludedNamespace AdmissionReason = "ExcludedNamespace"
	// ReasonNotPodCreate (allowed): a request for anything but a Pod
	// CREATE, which the webhook configuration should not send.
	ReasonNotPodCreate AdmissionReason = "NotPodCreate"
	// ReasonInvalidGPURequest (denied, 400): Mutate rejected the pod's GPU
	// request or placement annotations.
	ReasonInvalidGPURequest AdmissionReason = "InvalidGPURequest"
	// ReasonForgedAllocation (denied, 403): the pod carries the allocation
	// annotation only the scheduler extender may write.
	ReasonForgedAllocation AdmissionReason = "ForgedAllocation"
	// ReasonMalformedPod (denied, 400): request.object is missing or not a
	// Pod, or the pod has no namespace.
	ReasonMalformedPod AdmissionReason = "MalformedPod"
	// ReasonTemplateConflict (denied, 409): a ResourceClaimTemplate holds
	// the name of the pod's claim template but is not the one the webhook
	// makes (Templates.Ensure, ErrTemplateConflict).
	ReasonTemplateConflict AdmissionReason = "TemplateConflict"
	// ReasonInternalError (denied, 500): the webhook could not decide or
	// encode its answer.
	ReasonInternalError AdmissionReason = "InternalError"
)

// admissionReasons lists every decision and reason pair, so that each
// series exists from the start at 0.
var admissionReasons = map[AdmissionReason]Decision{
	ReasonGPUPod:            DecisionPatched,
	ReasonGPUPodUnchanged:   DecisionAllowed,
	ReasonNotGPUPod:         DecisionAllowed,
	ReasonExcludedNamespace: DecisionAllowed,
	ReasonNotPodCreate:      DecisionAllowed,
	ReasonInvalidGPURequest: DecisionDenied,
	ReasonForgedAllocation:  DecisionDenied,
	ReasonMalformedPod:      DecisionDenied,
	ReasonTemplateConflict:  DecisionDenied,
	ReasonInternalError:     DecisionDenied,
}

// durationBuckets: a decision takes well under a millisecond; the tail
// covers a large pod on a loaded node, far below the API server's
// timeoutSeconds.
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

// metrics are the webhook's Prometheus metrics in their own registry; safe
// for concurrent use.
type metrics struct {
	set        registry.Set
	registry   *prometheus.Registry
	handler    http.Handler
	admissions *prometheus.CounterVec
	durations  *prometheus.HistogramVec
	invalid    *prometheus.CounterVec
}

// newMetrics returns the webhook's metrics in a new registry, beside the
// Go runtime and process collectors.
func newMetrics() (*metrics, error) {
	reg, err := registry.New()
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	m := &metrics{
		registry: reg,
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}),
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricAdmissions,
			Help: "AdmissionReviews answered, by decision (patched, allowed, denied) and reason.",
		}, []string{"decision", "reason"}),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricAdmissionDuration,
			Help:    "Time from reading an AdmissionReview to writing its answer, by decision.",
			Buckets: durationBuckets,
		}, []string{"decision"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricInvalidRequests,
			Help: "Requests to the mutate path answered without an AdmissionReview (wrong Content-Type, too large, not an admission.k8s.io/v1 AdmissionReview), by HTTP status code.",
		}, []string{"code"}),
	}
	for reason, decision := range admissionReasons {
		m.admissions.WithLabelValues(string(decision), string(reason))
	}
	set, err := registry.Register(reg, m.admissions, m.durations, m.invalid)
	if err != nil {
		return nil, fmt.Errorf("webhook: metrics: %w", err)
	}
	m.set = set
	return m, nil
}

// MetricNames returns the names of the metrics the webhook exports on
// /metrics (beside the Go runtime and process metrics), from the
// collectors it registers.
func MetricNames() ([]string, error) {
	m, err := newMetrics()
	if err != nil {
		return nil, err
	}
	return m.set.Names(), nil
}

// admitted counts one answered AdmissionReview that took elapsed.
func (m *metrics) admitted(reason AdmissionReason, elapsed time.Duration) {
	decision := admissionReasons[reason]
	m.admissions.WithLabelValues(string(decision), string(reason)).Inc()
	m.durations.WithLabelValues(string(decision)).Observe(elapsed.Seconds())
}

// rejected counts one request answered with an HTTP error status.
func (m *metrics) rejected(status int) {
	m.invalid.WithLabelValues(strconv.Itoa(status)).Inc()
}

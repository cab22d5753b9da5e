package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/gorilla/mux"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/internal/probe"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Paths the handler serves.
const (
	// MutatePath takes POSTed AdmissionReview v1 requests: the path of the
	// MutatingWebhookConfiguration's clientConfig.
	MutatePath = "/mutate"
	// HealthzPath answers GET with 200 while the process serves.
	HealthzPath = probe.HealthzPath
	// ReadyzPath answers GET with 200 while the webhook can admit pods, 503
	// otherwise (for a Server: while its certificate has expired).
	ReadyzPath = probe.ReadyzPath
)

// maxRequestBytes bounds an AdmissionReview body. The API server takes
// request bodies up to 3 MiB and etcd objects up to 1.5 MiB; a review of a
// CREATE holds one object, re-encoded as JSON, plus a little metadata. Twice
// the API server's own limit leaves room for that and still refuses a body
// that could only exhaust memory.
const maxRequestBytes = 6 << 20

// admissionReviewAPIVersion is the only AdmissionReview version served; the
// webhook configuration must list it in admissionReviewVersions.
var admissionReviewAPIVersion = admissionv1.SchemeGroupVersion.String()

// NewHandler returns the webhook's HTTP routes for cfg: POST MutatePath,
// GET HealthzPath, GET ReadyzPath (always ready: only a Server knows
// about certificates) and GET MetricsPath, which serves the handler's own
// metrics registry (docs/metrics.md). Other methods on these paths get
// 405, other paths 404. It returns an error when cfg fails Validate. The
// handler is safe for concurrent use and logs with the request context's
// klog logger.
//
// MutatePath answers, in HTTP terms: 415 unless the Content-Type is
// application/json; 413 for a body over a few MiB; 400 for an empty or
// undecodable body, a review that is not admission.k8s.io/v1
// AdmissionReview, or one without a request or request.uid. Otherwise it
// answers 200 with an AdmissionReview whose response echoes request.uid:
//   - for anything but a Pod CREATE (another kind, a subresource, another
//     operation): allowed, no patch;
//   - for a Pod CREATE, Mutate's decision on the pod in request.object with
//     request.namespace as its namespace: allowed with patchType JSONPatch
//     when there are operations, allowed without a patch when there are
//     none, or denied with Mutate's message and code 403 (reason Forbidden)
//     when the pod carries vgpu.AnnotationPodAllocation, 400 (reason
//     BadRequest) otherwise;
//   - for a request.object that does not decode as a Pod: denied, 400,
//     naming the decoding error.
//
// Each answered review is counted in MetricAdmissions by Decision and
// AdmissionReason and timed in MetricAdmissionDuration; each request
// answered with an HTTP error instead is counted in MetricInvalidRequests.
func NewHandler(cfg Config) (http.Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	m, err := newMetrics()
	if err != nil {
		return nil, err
	}
	return newRouter(cfg, nil, func() error { return nil }, m), nil
}

// NewHandlerWithTemplates is NewHandler whose pods converted to claims
// (Config.DRA) get their template from templates, which must be set when
// cfg.DRA.Enabled.
func NewHandlerWithTemplates(cfg Config, templates Templates) (http.Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	if cfg.DRA.Enabled && templates == nil {
		return nil, ErrNoTemplates
	}
	m, err := newMetrics()
	if err != nil {
		return nil, err
	}
	return newRouter(cfg, templates, func() error { return nil }, m), nil
}

// ErrNoTemplates is returned when DRA conversion is on and nothing can
// create the claim templates (no API client).
var ErrNoTemplates = errors.New("webhook: dra.enabled needs a Kubernetes client to create ResourceClaimTemplates")

// newRouter returns the routes of NewHandler for a valid cfg, with ready as
// the readiness check and m as the metrics.
func newRouter(cfg Config, templates Templates, ready func() error, m *metrics) *mux.Router {
	h := &handler{cfg: cfg, templates: templates, metrics: m}
	r := mux.NewRouter()
	r.HandleFunc(MutatePath, h.serveMutate).Methods(http.MethodPost)
	probe.Routes(r, ready, m.handler)
	return r
}

// handler serves MutatePath; it holds no mutable state but its metrics.
type handler struct {
	cfg       Config
	templates Templates // nil unless cfg.DRA.Enabled
	metrics   *metrics
}

// serveMutate decodes an AdmissionReview, decides and encodes the answer.
func (h *handler) serveMutate(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	logger := klog.FromContext(r.Context())
	review, status, err := decodeReview(w, r)
	if err != nil {
		logger.V(1).Info("Rejected an admission request", "status", status, "err", err, "remote", r.RemoteAddr)
		probe.Text(w, status, err.Error())
		h.metrics.rejected(status)
		return
	}
	req := review.Request
	logger = logger.WithValues("uid", req.UID, "namespace", req.Namespace, "name", req.Name, "operation", req.Operation)
	resp, reason := h.review(r.Context(), req)
	defer func() { h.metrics.admitted(reason, time.Since(start)) }()
	switch {
	case !resp.Allowed:
		logger.V(1).Info("Denied a pod", "code", resp.Result.Code, "message", resp.Result.Message)
	case resp.Patch != nil:
		logger.V(2).Info("Patched a pod", "patch", string(resp.Patch))
	default:
		logger.V(3).Info("Allowed without a patch")
	}
	body, err := json.Marshal(&admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionReviewAPIVersion, Kind: "AdmissionReview"},
		Response: resp,
	})
	if err != nil { // Not expected: every field marshals.
		logger.Error(err, "Cannot encode the admission response")
		probe.Text(w, http.StatusInternalServerError, "cannot encode the admission response: "+err.Error())
		reason = ReasonInternalError
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(body); err != nil {
		logger.V(1).Info("Cannot write the admission response", "err", err)
	}
}

// decodeReview reads and checks r's AdmissionReview. On failure it returns
// the HTTP status to answer and an error that says what is wrong.
func decodeReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, int, error) {
	mediaType, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mediaType != "application/json" {
		return nil, http.StatusUnsupportedMediaType, fmt.Errorf("request Content-Type %q: must be application/json", r.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body: larger than %d bytes", tooLarge.Limit)
	case err != nil:
		return nil, http.StatusBadRequest, fmt.Errorf("read request body: %w", err)
	case len(bytes.TrimSpace(body)) == 0:
		return nil, http.StatusBadRequest, errors.New("request body: empty: must be an admission.k8s.io/v1 AdmissionReview")
	}
	review := &admissionv1.AdmissionReview{}
	if err := json.Unmarshal(body, review); err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("request body: not an AdmissionReview: %w", err)
	}
	switch {
	case review.APIVersion != admissionReviewAPIVersion || review.Kind != "AdmissionReview":
		return nil, http.StatusBadRequest, fmt.Errorf("request body: apiVersion %q kind %q: must be %s AdmissionReview (list only v1 in the webhook's admissionReviewVersions)",
			review.APIVersion, review.Kind, admissionReviewAPIVersion)
	case review.Request == nil:
		return nil, http.StatusBadRequest, errors.New("request body: AdmissionReview without a request")
	case review.Request.UID == "":
		return nil, http.StatusBadRequest, errors.New("request body: AdmissionReview request without a uid")
	}
	return review, http.StatusOK, nil
}

// review returns the response to req, which has a UID, and the reason for
// the metrics.
func (h *handler) review(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, AdmissionReason) {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Group != corev1.GroupName || req.Kind.Version != "v1" || req.Kind.Kind != "Pod" ||
		req.SubResource != "" || req.Operation != admissionv1.Create {
		return resp, ReasonNotPodCreate
	}
	raw := bytes.TrimSpace(req.Object.Raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return denied(resp, http.StatusBadRequest, "request.object: missing: a pod CREATE must carry the pod"), ReasonMalformedPod
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(raw, pod); err != nil {
		return denied(resp, http.StatusBadRequest, "request.object: cannot decode the pod: "+err.Error()), ReasonMalformedPod
	}
	if req.Namespace != "" {
		// The request's namespace comes from the URL; a pod created there
		// may leave metadata.namespace empty.
		pod.Namespace = req.Namespace
	}
	if pod.Namespace == "" {
		return denied(resp, http.StatusBadRequest, "request.namespace: empty: a pod must be created in a namespace"), ReasonMalformedPod
	}
	res := mutate(pod, h.cfg) // h.cfg passed Validate in NewHandler
	switch {
	case !res.Allowed:
		if _, forged := pod.Annotations[vgpu.AnnotationPodAllocation]; forged {
			return denied(resp, http.StatusForbidden, res.Message), ReasonForgedAllocation
		}
		return denied(resp, http.StatusBadRequest, res.Message), ReasonInvalidGPURequest
	case res.Skipped && h.cfg.excluded(pod.Namespace):
		return resp, ReasonExcludedNamespace
	case res.Skipped:
		return resp, ReasonNotGPUPod
	case len(res.Patch) == 0:
		return resp, ReasonGPUPodUnchanged
	case res.Template != nil && (req.DryRun == nil || !*req.DryRun):
		// sideEffects NoneOnDryRun: a dry run creates nothing.
		if h.templates == nil {
			return denied(resp, http.StatusInternalServerError, "gpuslice webhook: "+ErrNoTemplates.Error()), ReasonInternalError
		}
		if err := h.templates.Ensure(ctx, res.Template); errors.Is(err, ErrTemplateConflict) {
			return denied(resp, http.StatusConflict, "gpuslice webhook: the pod's claim template: "+err.Error()), ReasonTemplateConflict
		} else if err != nil {
			return denied(resp, http.StatusInternalServerError, "gpuslice webhook: the pod's claim template: "+err.Error()), ReasonInternalError
		}
	}
	patch, err := json.Marshal(res.Patch)
	if err != nil { // Not expected: the values are strings and string maps.
		return denied(resp, http.StatusInternalServerError, "gpuslice webhook: cannot encode the patch: "+err.Error()), ReasonInternalError
	}
	patchType := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &patchType
	return resp, ReasonGPUPod
}

// denied turns resp into a denial with code and message.
func denied(resp *admissionv1.AdmissionResponse, code int32, message string) *admissionv1.AdmissionResponse {
	resp.Allowed = false
	resp.Result = &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    code,
		Reason:  reasonForCode(code),
		Message: message,
	}
	return resp
}

func reasonForCode(code int32) metav1.StatusReason {
	switch code {
	case http.StatusBadRequest:
		return metav1.StatusReasonBadRequest
	case http.StatusForbidden:
		return metav1.StatusReasonForbidden
	case http.StatusConflict:
		return metav1.StatusReasonConflict
	default:
		return metav1.StatusReasonInternalError
	}
}

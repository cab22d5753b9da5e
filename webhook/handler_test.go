package webhook_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
	"github.com/gpuslice/gpuslice/webhook"
)

// reviewRequest is an AdmissionReview v1 request for the table below.
type reviewRequest struct {
	uid       string
	op        admissionv1.Operation
	namespace string
	kind      metav1.GroupVersionKind
	subres    string
	object    any // encoded as JSON; a []byte is sent as is
}

var podKind = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}

// createPod is a pod CREATE in namespace ns, as the API server sends it:
// metadata.namespace left empty, the namespace in the request.
func createPod(uid, ns string, pod *corev1.Pod) reviewRequest {
	pod = pod.DeepCopy()
	pod.Namespace = ""
	return reviewRequest{uid: uid, op: admissionv1.Create, namespace: ns, kind: podKind, object: pod}
}

func (r reviewRequest) body(t *testing.T) string {
	t.Helper()
	raw, ok := r.object.([]byte)
	if !ok && r.object != nil {
		var err error
		if raw, err = json.Marshal(r.object); err != nil {
			t.Fatal(err)
		}
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID(r.uid), Kind: r.kind, SubResource: r.subres, Operation: r.op,
			Namespace: r.namespace, Object: runtime.RawExtension{Raw: raw},
		},
	}
	out, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// reviewSummary is what a test checks of an AdmissionReview response, with
// the patch decoded.
type reviewSummary struct {
	UID       types.UID
	Allowed   bool
	PatchType string
	Patch     []webhook.JSONPatchOp
	Code      int32
	Reason    metav1.StatusReason
	Message   string
}

func summarize(t *testing.T, body []byte) reviewSummary {
	t.Helper()
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		t.Fatalf("decode response %s: %v", body, err)
	}
	if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" || review.Response == nil {
		t.Fatalf("response is not an AdmissionReview v1 with a response: %s", body)
	}
	resp := review.Response
	s := reviewSummary{UID: resp.UID, Allowed: resp.Allowed}
	if resp.PatchType != nil {
		s.PatchType = string(*resp.PatchType)
	}
	if resp.Patch != nil {
		if err := json.Unmarshal(resp.Patch, &s.Patch); err != nil {
			t.Fatalf("decode patch %s: %v", resp.Patch, err)
		}
	}
	if resp.Result != nil {
		s.Code, s.Reason, s.Message = resp.Result.Code, resp.Result.Reason, resp.Result.Message
	}
	return s
}

func TestHandler(t *testing.T) {
	h, err := webhook.NewHandler(webhook.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	gpuPod := vgputest.Pod("p").Limit(vgpu.ResourceMemory, "10Gi").Obj()
	gpuPod.Spec.SchedulerName = corev1.DefaultSchedulerName
	allowed := func(uid string) *reviewSummary { return &reviewSummary{UID: types.UID(uid), Allowed: true} }
	denied := func(uid string, code int32, reason metav1.StatusReason, msg string) *reviewSummary {
		return &reviewSummary{UID: types.UID(uid), Code: code, Reason: reason, Message: msg}
	}
	const appJSON = "application/json"

	tests := []struct {
		name        string
		method      string // default POST
		path        string // default /mutate
		contentType string // default application/json
		body        string // default req.body()
		req         reviewRequest
		wantStatus  int
		wantReview  *reviewSummary // for a 200 from /mutate
		wantText    string         // otherwise
	}{{
		name: "GPU pod: uid echoed, patched",
		req:  createPod("uid-1", "default", gpuPod),
		wantReview: &reviewSummary{UID: "uid-1", Allowed: true, PatchType: "JSONPatch", Patch: []webhook.JSONPatchOp{
			{Op: "replace", Path: "/spec/schedulerName", Value: "gpuslice-scheduler"},
			{Op: "add", Path: "/spec/containers/0/resources/limits/hami.io~1gpu", Value: "1"},
			{Op: "replace", Path: "/spec/containers/0/resources/limits/hami.io~1gpumem", Value: "10240"},
		}},
	}, {
		name:       "GPU pod in an excluded namespace, from request.namespace: allowed untouched",
		req:        createPod("uid-2", "kube-system", gpuPod),
		wantReview: allowed("uid-2"),
	}, {
		name: "invalid cores: denied with 400 naming container, resource, value and rule",
		req:  createPod("uid-3", "default", vgputest.Pod("p").Cores(150).Obj()),
		wantReview: denied("uid-3", http.StatusBadRequest, metav1.StatusReasonBadRequest,
			`container "main": hami.io/gpucores=150: must be an integer from 1 to 100`),
	}, {
		name: "forged allocation annotation: denied with 403",
		req:  createPod("uid-4", "default", vgputest.Pod("p").Annotation(vgpu.AnnotationPodAllocation, "{}").GPU(1).Obj()),
		wantReview: denied("uid-4", http.StatusForbidden, metav1.StatusReasonForbidden,
			`annotation hami.io/gpu-allocation="{}": must not be set when the pod is created: only the gpuslice scheduler extender writes it, when it binds the pod`),
	}, {
		name:       "pod without GPU resources: allowed, no patch",
		req:        createPod("uid-5", "default", vgputest.Pod("p").Limit(corev1.ResourceCPU, "1").Obj()),
		wantReview: allowed("uid-5"),
	}, {
		name: "pod UPDATE: allowed, not looked at",
		req: reviewRequest{uid: "uid-6", op: admissionv1.Update, namespace: "default", kind: podKind,
			object: vgputest.Pod("p").Cores(150).Obj()},
		wantReview: allowed("uid-6"),
	}, {
		name: "pod subresource: allowed, not looked at",
		req: reviewRequest{uid: "uid-7", op: admissionv1.Create, namespace: "default", kind: podKind, subres: "binding",
			object: []byte(`{"target":{"name":"n1"}}`)},
		wantReview: allowed("uid-7"),
	}, {
		name: "another kind: allowed, not looked at",
		req: reviewRequest{uid: "uid-8", op: admissionv1.Create, namespace: "default",
			kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, object: []byte(`{"spec":"x"}`)},
		wantReview: allowed("uid-8"),
	}, {
		name: "object that is not a pod: denied, not a 500",
		req:  reviewRequest{uid: "uid-9", op: admissionv1.Create, namespace: "default", kind: podKind, object: []byte(`{"spec":{"containers":"main"}}`)},
		wantReview: denied("uid-9", http.StatusBadRequest, metav1.StatusReasonBadRequest,
			"request.object: cannot decode the pod: json: cannot unmarshal string into Go struct field PodSpec.spec.containers of type []v1.Container"),
	}, {
		name: "bad quantity in the pod: denied",
		req: reviewRequest{uid: "uid-10", op: admissionv1.Create, namespace: "default", kind: podKind,
			object: []byte(`{"spec":{"containers":[{"name":"main","resources":{"limits":{"hami.io/gpu":"lots"}}}]}}`)},
		wantReview: denied("uid-10", http.StatusBadRequest, metav1.StatusReasonBadRequest,
			"request.object: cannot decode the pod: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"),
	}, {
		name: "no object: denied",
		req:  reviewRequest{uid: "uid-11", op: admissionv1.Create, namespace: "default", kind: podKind},
		wantReview: denied("uid-11", http.StatusBadRequest, metav1.StatusReasonBadRequest,
			"request.object: missing: a pod CREATE must carry the pod"),
	}, {
		name: "no namespace anywhere: denied",
		req:  reviewRequest{uid: "uid-12", op: admissionv1.Create, kind: podKind, object: vgputest.Pod("p").Namespace("").GPU(1).Obj()},
		wantReview: denied("uid-12", http.StatusBadRequest, metav1.StatusReasonBadRequest,
			"request.namespace: empty: a pod must be created in a namespace"),
	}, {
		name:       "garbage body: 400",
		body:       "{not json",
		wantStatus: http.StatusBadRequest,
		wantText:   "request body: not an AdmissionReview: invalid character 'n' looking for beginning of object key string",
	}, {
		name:       "empty body: 400",
		body:       " \n",
		wantStatus: http.StatusBadRequest,
		wantText:   "request body: empty: must be an admission.k8s.io/v1 AdmissionReview",
	}, {
		name:       "no request: 400",
		body:       `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`,
		wantStatus: http.StatusBadRequest,
		wantText:   "request body: AdmissionReview without a request",
	}, {
		name:       "no uid: 400",
		body:       `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}`,
		wantStatus: http.StatusBadRequest,
		wantText:   "request body: AdmissionReview request without a uid",
	}, {
		name:       "v1beta1 review: 400",
		body:       `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}`,
		wantStatus: http.StatusBadRequest,
		wantText:   `request body: apiVersion "admission.k8s.io/v1beta1" kind "AdmissionReview": must be admission.k8s.io/v1 AdmissionReview (list only v1 in the webhook's admissionReviewVersions)`,
	}, {
		name:        "not JSON: 415",
		contentType: "application/yaml",
		req:         createPod("u", "default", gpuPod),
		wantStatus:  http.StatusUnsupportedMediaType,
		wantText:    `request Content-Type "application/yaml": must be application/json`,
	}, {
		name:        "JSON with a charset: served",
		contentType: "application/json; charset=utf-8",
		req:         createPod("uid-13", "default", vgputest.Pod("p").Obj()),
		wantReview:  allowed("uid-13"),
	}, {
		name:       "body too large: 413",
		body:       `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":"` + strings.Repeat("x", 7<<20) + `"}}`,
		wantStatus: http.StatusRequestEntityTooLarge,
		wantText:   "request body: larger than 6291456 bytes",
	}, {
		name:       "GET /mutate: 405",
		method:     http.MethodGet,
		wantStatus: http.StatusMethodNotAllowed,
	}, {
		name:       "healthz",
		method:     http.MethodGet,
		path:       webhook.HealthzPath,
		wantStatus: http.StatusOK,
		wantText:   "ok",
	}, {
		name:       "readyz",
		method:     http.MethodGet,
		path:       webhook.ReadyzPath,
		wantStatus: http.StatusOK,
		wantText:   "ok",
	}, {
		name:       "POST healthz: 405",
		path:       webhook.HealthzPath,
		wantStatus: http.StatusMethodNotAllowed,
	}, {
		name:       "unknown path: 404",
		path:       "/validate",
		wantStatus: http.StatusNotFound,
		wantText:   "404 page not found",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			method, path, contentType, body := tt.method, tt.path, tt.contentType, tt.body
			if method == "" {
				method = http.MethodPost
			}
			if path == "" {
				path = webhook.MutatePath
			}
			if contentType == "" {
				contentType = appJSON
			}
			if body == "" && method == http.MethodPost && tt.req.uid != "" {
				body = tt.req.body(t)
			}
			r := httptest.NewRequest(method, path, strings.NewReader(body))
			r.Header.Set("Content-Type", contentType)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)

			wantStatus := tt.wantStatus
			if tt.wantReview != nil {
				wantStatus = http.StatusOK
			}
			if w.Code != wantStatus {
				t.Fatalf("status %d, want %d; body:\n%s", w.Code, wantStatus, w.Body.String())
			}
			if tt.wantReview == nil {
				if diff := cmp.Diff(tt.wantText, strings.TrimSpace(w.Body.String())); diff != "" {
					t.Errorf("body (-want +got):\n%s", diff)
				}
				return
			}
			if got := w.Header().Get("Content-Type"); got != appJSON {
				t.Errorf("Content-Type %q, want %q", got, appJSON)
			}
			if diff := cmp.Diff(*tt.wantReview, summarize(t, w.Body.Bytes())); diff != "" {
				t.Errorf("AdmissionReview response (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewHandlerInvalidConfig(t *testing.T) {
	_, err := webhook.NewHandler(webhook.Config{SchedulerName: corev1.DefaultSchedulerName})
	if err == nil || !strings.Contains(err.Error(), `schedulerName="default-scheduler"`) {
		t.Errorf("NewHandler: got %v, want an error naming schedulerName", err)
	}
}

// FuzzServeMutate feeds arbitrary bodies to /mutate: the handler must never
// panic, and must answer either an HTTP error or an AdmissionReview that
// echoes the request's uid.
func FuzzServeMutate(f *testing.F) {
	h, err := webhook.NewHandler(webhook.DefaultConfig())
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		"", "null", "{}", "[]", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"default","object":{"spec":{"containers":[{"name":"c","resources":{"limits":{"hami.io/gpumem":"10Gi"}}}]}}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"default","object":{"spec":{"initContainers":[{"resources":{"requests":{"hami.io/gpucores":"1e400"}}}]}}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":"pod"}}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest(http.MethodPost, webhook.MutatePath, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		switch w.Code {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return
		case http.StatusOK:
		default:
			t.Fatalf("status %d for body %q", w.Code, body)
		}
		var in admissionv1.AdmissionReview
		if err := json.Unmarshal([]byte(body), &in); err != nil || in.Request == nil {
			t.Fatalf("200 for a body that is not a review with a request: %q", body)
		}
		if got := summarize(t, w.Body.Bytes()); got.UID != in.Request.UID {
			t.Fatalf("response uid %q, want %q", got.UID, in.Request.UID)
		}
	})
}

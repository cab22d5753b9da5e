package webhook_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/gpuslice/gpuslice/webhook"
)

// fuzzReview posts body to the handler's MutatePath and checks what any caller must get: no
// panic, and 200 with an AdmissionReview that echoes the request uid, or a 4xx with a message;
// never a 5xx.
func fuzzReview(t *testing.T, h http.Handler, body []byte) {
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, webhook.MutatePath, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	switch code := rec.Code; {
	case code >= 500:
		t.Fatalf("POST %q: HTTP %d %q, want 200 or a 4xx", body, code, rec.Body.String())
	case code >= 400:
		if rec.Body.Len() == 0 {
			t.Fatalf("POST %q: HTTP %d without a message", body, code)
		}
	default:
		var in, out admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &in); err != nil || in.Request == nil {
			t.Fatalf("POST %q: HTTP %d for a body that is not a review with a request", body, code)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil || out.Response.UID != in.Request.UID {
			t.Fatalf("POST %q: answer %q does not echo uid %q (%v)", body, rec.Body.String(), in.Request.UID, err)
		}
		if r := out.Response; !r.Allowed && (r.Result == nil || r.Result.Message == "" || r.Result.Code >= 500) {
			t.Fatalf("POST %q: denial %+v without a message or with a 5xx code", body, r.Result)
		}
	}
}

func newFuzzHandler(f *testing.F) http.Handler {
	h, err := webhook.NewHandler(webhook.DefaultConfig())
	if err != nil {
		f.Fatal(err)
	}
	return h
}

// review wraps a pod (raw JSON) in an AdmissionReview of a Pod CREATE.
func review(pod string) []byte {
	return []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"group":"","version":"v1","kind":"Pod"},` +
		`"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"default","operation":"CREATE","object":` + pod + `}}`)
}

// FuzzAdmissionReview fuzzes the whole request body.
func FuzzAdmissionReview(f *testing.F) {
	for _, pod := range fuzzPods {
		f.Add(review(pod))
	}
	for _, b := range []string{``, `{`, `null`, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}`} {
		f.Add([]byte(b))
	}
	h := newFuzzHandler(f)
	f.Fuzz(func(t *testing.T, body []byte) { fuzzReview(t, h, body) })
}

// FuzzAdmissionPod fuzzes the pod inside a well-formed review, where the decisions are.
func FuzzAdmissionPod(f *testing.F) {
	for _, pod := range fuzzPods {
		f.Add(pod)
	}
	h := newFuzzHandler(f)
	f.Fuzz(func(t *testing.T, pod string) { fuzzReview(t, h, review(pod)) })
}

var fuzzPods = []string{
	`{"metadata":{"name":"p"},"spec":{"containers":[{"name":"main","resources":{"limits":{"hami.io/gpumem":"10Gi"}}}]}}`,
	`{"metadata":{"name":"p","annotations":{"hami.io/gpu-allocation":"{}","hami.io/node-policy":"x"}},"spec":{"nodeName":"n","containers":[{"name":"a","resources":{"limits":{"hami.io/gpu":"17","hami.io/gpucores":"150"}}}]}}`,
	`{"spec":{"initContainers":[{"name":"i","restartPolicy":"Always","resources":{"requests":{"hami.io/gpumem-percentage":"50"}}}],"containers":[]}}`,
	`{"spec":{"containers":[{"name":"c","resources":{"limits":{"hami.io/gpumemory":"1","cpu":"1"}}}]}}`,
	`null`, `5`, `{"spec":{"containers":[{"resources":{"limits":{"hami.io/gpumem":"1e300"}}}]}}`,
}

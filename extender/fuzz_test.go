package extender

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// fuzzBodies seeds every endpoint fuzzer: well-formed calls of kube-scheduler, their fields of
// the wrong type, and garbage.
var fuzzBodies = []string{
	`{"Pod":{"metadata":{"name":"p","namespace":"default","uid":"u"},"spec":{"containers":[{"name":"main","resources":{"limits":{"hami.io/gpu":"1","hami.io/gpumem":"1024"}}}]}},"NodeNames":["n1"]}`,
	`{"Pod":{"metadata":{"name":"p","annotations":{"hami.io/gpu-policy":"spread","hami.io/gpu-uuid":"GPU-x"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"hami.io/gpu":"17"}}}]}},"Nodes":{"items":[{"metadata":{"name":"n1"}}]}}`,
	`{"PodName":"p","PodNamespace":"default","PodUID":"u","Node":"n1"}`,
	`{"PodName":"p","PodNamespace":"default","PodUID":"u","Node":"n-unknown"}`,
	`{"Pod":{"spec":{"containers":[{"resources":{"limits":{"hami.io/gpumem":"1e300"}}}]}},"NodeNames":[]}`,
	`{"Pod":{"metadata":{"name":"p","namespace":"default","uid":"u"},"spec":{"resourceClaims":[{"name":"gpu","resourceClaimTemplateName":"t"}]},"status":{"resourceClaimStatuses":[{"name":"gpu","resourceClaimName":"p-gpu"}]}},"NodeNames":["n1","n2"]}`,
	`{"Pod":5,"NodeNames":"a"}`, `{}`, `null`, `[`, ``,
}

// fuzzEndpoint posts body to path of a Scheduler with one node: whatever a stranger sends, the
// extender answers (no panic, no hang: the test's deadline bounds the call) with 200 or a 4xx
// whose body names the problem, never a 5xx.
func fuzzEndpoint(f *testing.F, path string) { fuzzEndpointWith(f, path, false) }

// fuzzEndpointWith is fuzzEndpoint with Config.DRA set to dra, and then a DRA node beside.
func fuzzEndpointWith(f *testing.F, path string, dra bool) {
	for _, b := range fuzzBodies {
		f.Add([]byte(b))
	}
	_, n1 := gpuNode("n1", 2, 16384)
	cfg := testConfig()
	cfg.DRA = dra
	if dra {
		n1 = append(n1, vgputest.DRANodeSlice("n2", 2, 16384, "Tesla T4"), vgputest.DRAClass())
	}
	e := newEnv(f, cfg, n1...)
	h := e.s.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch code := rec.Code; {
		case code >= 500:
			t.Fatalf("POST %s %q: HTTP %d %q, want 200 or a 4xx", path, body, code, rec.Body.String())
		case code >= 400 && rec.Body.Len() == 0:
			t.Fatalf("POST %s %q: HTTP %d without a message", path, body, code)
		}
	})
}

func FuzzFilter(f *testing.F)     { fuzzEndpoint(f, "/filter") }
func FuzzPrioritize(f *testing.F) { fuzzEndpoint(f, "/prioritize") }
func FuzzBind(f *testing.F)       { fuzzEndpoint(f, "/bind") }

// FuzzDRAPrioritize posts stranger bodies to /dra/prioritize.
func FuzzDRAPrioritize(f *testing.F) { fuzzEndpointWith(f, "/dra/prioritize", true) }

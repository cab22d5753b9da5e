package extender

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

// TestGarbage sends bodies no kube-scheduler sends to every endpoint: each
// gets a 4xx with a plain message, and the server keeps serving.
func TestGarbage(t *testing.T) {
	_, n1 := gpuNode("n1", 1, 16384)
	e := newEnv(t, testConfig(), n1...)
	bodies := []struct {
		name, body string
		want       int
	}{
		{"empty", "", http.StatusBadRequest},
		{"open brace", "{", http.StatusBadRequest},
		{"not JSON", "not json", http.StatusBadRequest},
		{"null", "null", http.StatusBadRequest},
		{"empty object", "{}", http.StatusBadRequest},
		{"null pod", `{"Pod":null}`, http.StatusBadRequest},
		{"array", "[1,2,3]", http.StatusBadRequest},
		{"wrong types", `{"Pod":5,"NodeNames":"a","PodName":7}`, http.StatusBadRequest},
		{"two values", `{"Pod":{}} {"Pod":{}}`, http.StatusBadRequest},
		{"pod without node list", `{"Pod":{"metadata":{"name":"p"}}}`, http.StatusBadRequest},
		{"deep nesting", strings.Repeat("[", 100000), http.StatusBadRequest},
		{"too large", `{"NodeNames":["` + strings.Repeat("a", MaxRequestBytes) + `"]}`, http.StatusRequestEntityTooLarge},
	}
	for _, path := range []string{"/filter", "/prioritize", "/bind"} {
		for _, b := range bodies {
			t.Run(path+"/"+b.name, func(t *testing.T) {
				code, body := postRaw(t, e.srv.URL+path, "application/json", []byte(b.body), nil)
				if code != b.want || body == "" {
					t.Errorf("HTTP %d %q, want %d with a message", code, body, b.want)
				}
			})
		}
	}
	code, body := postRaw(t, e.srv.URL+"/filter", "text/plain", []byte(`{}`), nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "application/json") {
		t.Errorf("Content-Type text/plain: HTTP %d %q, want 400 naming application/json", code, body)
	}
	if code, _ := get(t, e.srv.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after garbage: HTTP %d", code)
	}
}

// TestRoutes checks methods, unknown paths and the health endpoints.
func TestRoutes(t *testing.T) {
	s, err := New(testConfig(), Options{Client: fake.NewClientset()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	tests := []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/filter", http.StatusMethodNotAllowed},
		{http.MethodPut, "/bind", http.StatusMethodNotAllowed},
		{http.MethodPost, "/healthz", http.StatusMethodNotAllowed},
		{http.MethodGet, "/nope", http.StatusNotFound},
		{http.MethodGet, "/healthz", http.StatusOK},
		{http.MethodGet, "/readyz", http.StatusServiceUnavailable}, // informers not started
	}
	for _, tt := range tests {
		req, err := http.NewRequestWithContext(context.Background(), tt.method, srv.URL+tt.path, bytes.NewReader(nil))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s %s: HTTP %d, want %d", tt.method, tt.path, resp.StatusCode, tt.want)
		}
	}

	e := newEnv(t, testConfig())
	if code, body := get(t, e.srv.URL+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after sync: HTTP %d %q", code, body)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(data)
}

package probe

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gorilla/mux"
)

func TestRoutes(t *testing.T) {
	notReady := errors.New("caches not synced")
	r := mux.NewRouter()
	Routes(r, func() error { return notReady }, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		Text(w, http.StatusOK, "metrics")
	}))
	get := func(method, path string) (int, string, string) {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		body, _ := io.ReadAll(rec.Body)
		return rec.Code, string(body), rec.Header().Get("Content-Type")
	}
	for _, tt := range []struct {
		method, path string
		code         int
		body         string
	}{
		{http.MethodGet, HealthzPath, 200, "ok\n"},
		{http.MethodHead, HealthzPath, 200, "ok\n"},
		{http.MethodGet, ReadyzPath, 503, "not ready: caches not synced\n"},
		{http.MethodGet, MetricsPath, 200, "metrics\n"},
		{http.MethodPost, HealthzPath, 405, ""},
	} {
		code, body, ctype := get(tt.method, tt.path)
		if code != tt.code || (tt.body != "" && body != tt.body) {
			t.Errorf("%s %s = %d %q, want %d %q", tt.method, tt.path, code, body, tt.code, tt.body)
		}
		if tt.body != "" && ctype != "text/plain; charset=utf-8" {
			t.Errorf("%s %s: Content-Type %q", tt.method, tt.path, ctype)
		}
	}
	notReady = nil
	if code, body, _ := get(http.MethodGet, ReadyzPath); code != 200 || body != "ok\n" {
		t.Errorf("ready: GET %s = %d %q, want 200 ok", ReadyzPath, code, body)
	}
}

package deviceplugin

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/metricstest"
)

// TestProbeHandler checks that /readyz follows the registration, /healthz
// always answers and /metrics serves the registered gauge, over a real
// HTTP server.
func TestProbeHandler(t *testing.T) {
	p, err := New(validConfig(), staticBackend{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.ProbeHandler())
	defer srv.Close()
	get := func(path string) int {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + path) //nolint:noctx // test against a local server
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	steps := []struct {
		name              string
		registered        bool
		readyz, livenessz int
	}{
		{"before registration", false, http.StatusServiceUnavailable, http.StatusOK},
		{"registered", true, http.StatusOK, http.StatusOK},
		{"kubelet restarted", false, http.StatusServiceUnavailable, http.StatusOK},
	}
	for _, s := range steps {
		p.setRegistration(registration{Registered: s.registered, Since: time.Now(), Socket: "s.sock"})
		if got := get("/readyz"); got != s.readyz {
			t.Errorf("%s: /readyz = %d, want %d", s.name, got, s.readyz)
		}
		if got := get("/healthz"); got != s.livenessz {
			t.Errorf("%s: /healthz = %d, want %d", s.name, got, s.livenessz)
		}
		want := 0.0
		if s.registered {
			want = 1
		}
		if got := metricstest.Scrape(t, srv.Client(), srv.URL+"/metrics")[MetricRegistered]; got != want {
			t.Errorf("%s: %s = %v, want %v", s.name, MetricRegistered, got, want)
		}
	}
	if got := get("/nope"); got != http.StatusNotFound {
		t.Errorf("/nope = %d, want 404", got)
	}
}

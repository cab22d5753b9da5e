package deviceplugin

import (
	"net/http"
)

// ProbeHandler serves the plugin's probe endpoints for the kubelet's
// readiness and liveness probes: GET /readyz answers 200 only while the
// kubelet has accepted the current registration (503 otherwise, e.g. right
// after a kubelet restart until the plugin has registered again), and GET
// /healthz answers 200 while the process serves. GET /metrics serves the
// plugin's Prometheus metrics (docs/metrics.md). Safe for concurrent use.
func (p *Plugin) ProbeHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", p.metrics.handler)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !p.Registered() {
			http.Error(w, "not registered with the kubelet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

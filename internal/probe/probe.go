// Package probe holds what the gpuslice HTTP servers answer alike: plain
// text, and the /healthz, /readyz and /metrics routes that kubelet probes
// and Prometheus call.
package probe

import (
	"io"
	"net/http"

	"github.com/gorilla/mux"
)

// Paths of the routes Routes adds.
const (
	HealthzPath = "/healthz"
	ReadyzPath  = "/readyz"
	MetricsPath = "/metrics"
)

// Text answers status with msg and a newline as text/plain.
func Text(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg+"\n") //nolint:gosec // G705: text/plain with nosniff is never rendered as HTML.
}

// Routes adds to r, for GET and HEAD: HealthzPath (200 "ok" while the
// process serves), ReadyzPath (200 "ok" while ready returns nil, else 503
// "not ready: " and its error) and MetricsPath (served by metrics).
func Routes(r *mux.Router, ready func() error, metrics http.Handler) {
	r.Handle(MetricsPath, metrics).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(HealthzPath, func(w http.ResponseWriter, _ *http.Request) {
		Text(w, http.StatusOK, "ok")
	}).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(ReadyzPath, func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			Text(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
		Text(w, http.StatusOK, "ok")
	}).Methods(http.MethodGet, http.MethodHead)
}

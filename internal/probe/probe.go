// Package probe holds what the gpuslice HTTP servers answer alike: plain
// text, and the /healthz, /readyz and /metrics routes that kubelet probes
// and Prometheus call.
package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/gorilla/mux"
	"k8s.io/klog/v2"
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

// Serve listens on addr (host:port) and serves h over plain HTTP until the
// returned stop is called; a failure after the listen is logged with ctx's
// logger. The error is the listen's.
func Serve(ctx context.Context, addr string, h http.Handler) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("probe endpoints: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Probe endpoints stopped")
		}
	}()
	return func() { _ = srv.Close() }, nil
}

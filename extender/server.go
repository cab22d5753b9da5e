package extender

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"slices"

	"github.com/gorilla/mux"

	"github.com/gpuslice/gpuslice/internal/probe"
)

// Handler returns the extender's HTTP API: POST /filter, /prioritize,
// /bind and /dra/prioritize (PrioritizeDRA; every node scores 0 without
// Config.DRA) take and return the k8s.io/kube-scheduler/extender/v1 types
// as JSON (Go field names as keys); GET /healthz answers 200 while the process
// serves; GET /readyz answers 200 once the informers synced, else 503;
// GET /metrics serves the Prometheus metrics (docs/metrics.md).
// A body that is empty, not one JSON value of the right shape, of another
// Content-Type, or without the arguments kube-scheduler always sends gets
// 400 with a plain-text message; a body above MaxRequestBytes gets 413; a
// wrong method gets 405. With Config.ClientCAFile, the three POST endpoints
// answer 403 to callers without a verified client certificate whose subject
// is in Config.AllowedClientNames; the probes
// and /metrics stay open. Every answer of the three POST endpoints, 4xx
// included, is counted and timed in the metrics.
func (s *Scheduler) Handler() http.Handler {
	r := mux.NewRouter()
	r.Handle("/filter", s.metrics.instrument("filter", s.authorized(jsonEndpoint(s.Filter)))).Methods(http.MethodPost)
	r.Handle("/prioritize", s.metrics.instrument("prioritize", s.authorized(jsonEndpoint(s.Prioritize)))).Methods(http.MethodPost)
	r.Handle("/bind", s.metrics.instrument("bind", s.authorized(jsonEndpoint(s.Bind)))).Methods(http.MethodPost)
	r.Handle("/dra/prioritize", s.metrics.instrument("dra/prioritize", s.authorized(jsonEndpoint(s.PrioritizeDRA)))).Methods(http.MethodPost)
	s.healthRoutes(r)
	return r
}

// healthHandler serves /healthz, /readyz and /metrics only, on
// Config.HealthAddress.
func (s *Scheduler) healthHandler() http.Handler {
	r := mux.NewRouter()
	s.healthRoutes(r)
	return r
}

// healthRoutes adds the probe routes (probe.Routes) and the 404 and 405
// answers to r.
func (s *Scheduler) healthRoutes(r *mux.Router) {
	probe.Routes(r, s.readyErr, s.metrics.handler)
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		probe.Text(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", req.Method, req.URL.Path))
	})
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		probe.Text(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s", req.URL.Path))
	})
}

// authorized lets a request through when Config.ClientCAFile is unset (the
// listener is then on loopback: Config.Validate), or when the caller
// presented a client certificate that verified against it and whose subject
// common name or a DNS name is in Config.AllowedClientNames.
func (s *Scheduler) authorized(next http.Handler) http.Handler {
	if s.cfg.ClientCAFile == "" {
		return next
	}
	allowed := make(map[string]bool, len(s.cfg.AllowedClientNames))
	for _, n := range s.cfg.AllowedClientNames {
		allowed[n] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			probe.Text(w, http.StatusForbidden, "a client certificate signed by the configured clientCAFile is required")
			return
		}
		leaf := r.TLS.VerifiedChains[0][0]
		if !allowed[leaf.Subject.CommonName] && !slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return allowed[n] }) {
			probe.Text(w, http.StatusForbidden, fmt.Sprintf("client certificate subject %q (DNS names %v): not in allowedClientNames", leaf.Subject.CommonName, leaf.DNSNames))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loadCAs reads a PEM bundle of CA certificates.
func loadCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path) //nolint:gosec // G304: the operator names the file.
	if err != nil {
		return nil, fmt.Errorf("client CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("client CA file %s: no PEM certificate found", path)
	}
	return pool, nil
}

// jsonEndpoint adapts a Scheduler method to HTTP: decode In, call, encode
// the result.
func jsonEndpoint[In, Out any](call func(context.Context, *In) (Out, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in In
		if status, err := decode(w, r, &in); err != nil {
			probe.Text(w, status, err.Error())
			return
		}
		out, err := call(r.Context(), &in)
		if err != nil {
			status := http.StatusInternalServerError
			if errors.Is(err, ErrBadArgs) {
				status = http.StatusBadRequest
			}
			probe.Text(w, status, err.Error())
			return
		}
		body, err := json.Marshal(out)
		if err != nil {
			probe.Text(w, http.StatusInternalServerError, "encode response: "+err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
	})
}

// decode reads exactly one JSON value of at most MaxRequestBytes into v.
// On failure it returns the status to answer with.
func decode(w http.ResponseWriter, r *http.Request, v any) (int, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return http.StatusBadRequest, fmt.Errorf("Content-Type %q: must be application/json", ct)
		}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			return http.StatusRequestEntityTooLarge, fmt.Errorf("request body above %d bytes", tooLarge.Limit)
		case errors.Is(err, io.EOF):
			return http.StatusBadRequest, errors.New("empty request body: expected a JSON object")
		}
		return http.StatusBadRequest, fmt.Errorf("malformed request body: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return http.StatusBadRequest, errors.New("malformed request body: more than one JSON value")
	}
	return 0, nil
}

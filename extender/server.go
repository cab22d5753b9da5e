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
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/internal/probe"
)

// Handler returns the extender's HTTP API: POST /filter, /prioritize,
// /bind and /dra/prioritize (PrioritizeDRA; every node scores 0 without
// Config.DRA) take and return the k8s.io/kube-scheduler/extender/v1 types
// as JSON (Go field names as keys; all but /bind read and write them
// through the codec, argsEndpoint, as encoding/json would); GET /healthz
// answers 200 while the process serves; GET /readyz answers 200 once the
// informers synced, else 503;
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
	r.Handle("/filter", s.metrics.instrument("filter", s.authorized(argsEndpoint(s.filter, appendFilterAnswer, (*filterAnswer).release)))).Methods(http.MethodPost)
	r.Handle("/prioritize", s.metrics.instrument("prioritize", s.authorized(argsEndpoint(s.Prioritize, appendHostPriorities, nil)))).Methods(http.MethodPost)
	r.Handle("/bind", s.metrics.instrument("bind", s.authorized(jsonEndpoint(s.Bind)))).Methods(http.MethodPost)
	r.Handle("/dra/prioritize", s.metrics.instrument("dra/prioritize", s.authorized(argsEndpoint(s.PrioritizeDRA, appendHostPriorities, nil)))).Methods(http.MethodPost)
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
			callFailed(w, err)
			return
		}
		body, err := json.Marshal(out)
		writeAnswer(w, body, err)
	})
}

// argsEndpoint adapts a Scheduler method that takes ExtenderArgs to HTTP
// through the codec, with jsonEndpoint's statuses and messages: read the
// arguments (argsReader), call, append the answer with write into a pooled
// buffer, then done(out) unless done is nil. write must produce what
// json.Marshal would of the answer.
func argsEndpoint[Out any](call func(context.Context, *extenderv1.ExtenderArgs) (Out, error),
	write func([]byte, *extenderv1.ExtenderArgs, Out) ([]byte, error), done func(Out)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in := argsReaderPool.Get().(*argsReader)
		defer in.release()
		if status, err := in.read(w, r); err != nil {
			probe.Text(w, status, err.Error())
			return
		}
		out, err := call(r.Context(), &in.args)
		if err != nil {
			callFailed(w, err)
			return
		}
		if done != nil {
			defer done(out)
		}
		buf := answerPool.Get().(*answerBuffer)
		defer buf.release()
		buf.b, err = write(buf.b[:0], &in.args, out)
		writeAnswer(w, buf.b, err)
	})
}

// callFailed answers the error of a Scheduler method: 400 when it wraps
// ErrBadArgs, else 500, with the message.
func callFailed(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	if errors.Is(err, ErrBadArgs) {
		status = http.StatusBadRequest
	}
	probe.Text(w, status, err.Error())
}

// writeAnswer answers 200 with body as JSON, or 500 when encoding it
// failed with err.
func writeAnswer(w http.ResponseWriter, body []byte, err error) {
	if err != nil {
		probe.Text(w, http.StatusInternalServerError, "encode response: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// decode reads exactly one JSON value of at most MaxRequestBytes into v.
// On failure it returns the status to answer with.
func decode(w http.ResponseWriter, r *http.Request, v any) (int, error) {
	if status, err := checkContentType(r); err != nil {
		return status, err
	}
	return decodeJSON(http.MaxBytesReader(w, r.Body, MaxRequestBytes), v)
}

// checkContentType refuses a request whose Content-Type is set and is not
// application/json, with the status to answer.
func checkContentType(r *http.Request) (int, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return http.StatusBadRequest, fmt.Errorf("Content-Type %q: must be application/json", ct)
		}
	}
	return 0, nil
}

// decodeJSON reads exactly one JSON value from body into v with
// encoding/json. On failure it returns the status to answer with: 413
// when body is an http.MaxBytesReader past its limit, else 400.
func decodeJSON(body io.Reader, v any) (int, error) {
	dec := json.NewDecoder(body)
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

package extender

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// holdingProxy forwards every request to the API server unchanged, except
// the Bindings (POST pods/<name>/binding) of the pods it is told to hold:
// it reads such a request, answers nothing until the client gives up on it
// (its connection closes), then hands it to the test, which sends it on
// (commit) or never does. Safe for concurrent use.
type holdingProxy struct {
	url       string
	upstream  *url.URL
	transport http.RoundTripper
	held      chan *heldRequest

	mu   sync.Mutex
	hold map[string]bool // pod names
}

// heldRequest is a Binding the proxy kept from the API server.
type heldRequest struct {
	pod    string
	uri    string // path and query
	header http.Header
	body   []byte
}

// startProxy serves a holdingProxy in front of the API server cfg reaches,
// with cfg's credentials; t.Cleanup stops it.
func startProxy(t *testing.T, cfg *rest.Config) *holdingProxy {
	t.Helper()
	upstream, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &holdingProxy{upstream: upstream, transport: transport, held: make(chan *heldRequest, 16), hold: map[string]bool{}}
	forward := httputil.NewSingleHostReverseProxy(upstream)
	forward.Transport = transport
	forward.FlushInterval = -1 // watches stream
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if pod, ok := bindingOf(r); ok && p.holds(pod) {
			p.keep(r, pod)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// holdBindings makes the proxy hold the Bindings of pod from now on.
func (p *holdingProxy) holdBindings(pod string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold[pod] = true
}

func (p *holdingProxy) holds(pod string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hold[pod]
}

// keep reads r, waits until its client gives up and hands it to the test.
func (p *holdingProxy) keep(r *http.Request, pod string) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the client went before it sent the Binding: nothing to hold
	}
	<-r.Context().Done()
	p.held <- &heldRequest{pod: pod, uri: r.URL.RequestURI(), header: r.Header.Clone(), body: body}
}

// next returns the next Binding held, once its client gave up, failing t
// after a minute without one.
func (p *holdingProxy) next(t *testing.T) *heldRequest {
	t.Helper()
	select {
	case h := <-p.held:
		return h
	case <-time.After(time.Minute):
		t.Fatal("no Binding held within a minute")
		return nil
	}
}

// commit sends h to the API server now, long after its client gave up,
// and returns the API server's status code.
func (p *holdingProxy) commit(ctx context.Context, h *heldRequest) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.upstream.String()+h.uri, bytes.NewReader(h.body))
	if err != nil {
		return 0, err
	}
	req.Header = h.header.Clone()
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		return 0, fmt.Errorf("forward the held Binding of %s: %w", h.pod, err)
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// bindingOf returns the pod name of a Binding request
// (POST /api/v1/namespaces/<ns>/pods/<name>/binding).
func bindingOf(r *http.Request) (string, bool) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method != http.MethodPost || len(parts) != 7 || parts[0] != "api" || parts[2] != "namespaces" || parts[4] != "pods" || parts[6] != "binding" {
		return "", false
	}
	return parts[5], true
}

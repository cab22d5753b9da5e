package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
)

// forwardTimeout bounds one request the proxy sends on after holding it.
const forwardTimeout = time.Minute

// APIProxy is a reverse proxy to the API server that runs in this process (Options.APIProxy) and
// that the extenders' kubeconfigs name, so that a test can make the API server slow to write for
// them. It serves TLS on loopback with a self-signed certificate of its own (CAData; a kubeconfig
// with a plain-HTTP server carries no credentials: client-go reads them for TLS servers alone) and
// passes each request on, its bearer token included, over TLS. Reads and watches pass at once. While a write delay is set, each write (POST, PUT,
// PATCH, DELETE) is read whole, held for the delay and then sent on whatever became of the client
// that sent it: a client that gave up after its own timeout (a Bind's) finds its write committed
// late, as when the API server or etcd stalls after accepting a request. Safe for concurrent use.
type APIProxy struct {
	srv *http.Server
	ln  net.Listener
	rp  *httputil.ReverseProxy
	// ca is the PEM certificate the proxy serves, its own CA.
	ca []byte
	// delay is the write delay in nanoseconds; held counts the writes held.
	delay, held atomic.Int64
	// ctx ends with Close, and with it every write held or being sent on.
	ctx    context.Context
	cancel context.CancelFunc
}

// startAPIProxy starts an APIProxy to the API server of cfg (its host and CA; the credentials are
// the clients' own) on a free loopback port.
func startAPIProxy(cfg *rest.Config) (*APIProxy, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("API proxy: API server URL: %w", err)
	}
	tlsConfig, err := rest.TLSConfigFor(&rest.Config{TLSClientConfig: cfg.TLSClientConfig})
	if err != nil {
		return nil, fmt.Errorf("API proxy: %w", err)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		return nil, fmt.Errorf("API proxy: certificate: %w", err)
	}
	// GenerateSelfSignedCertKey returns the serving certificate followed by the CA that signed it.
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("API proxy: certificate: %w", err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, fmt.Errorf("API proxy: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &APIProxy{ln: ln, ca: certPEM, ctx: ctx, cancel: cancel}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport:     &http.Transport{TLSClientConfig: tlsConfig, MaxIdleConnsPerHost: 100, IdleConnTimeout: 90 * time.Second},
		FlushInterval: -1, // watches stream
		// An API server restart breaks every connection at once; the clients see and retry.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// URL returns the proxy's base URL, for a kubeconfig's server.
func (p *APIProxy) URL() string { return "https://" + p.ln.Addr().String() }

// CAData returns the PEM certificates a client of the proxy trusts, for a kubeconfig's
// certificate-authority-data.
func (p *APIProxy) CAData() []byte { return p.ca }

// SetWriteDelay holds every write that arrives from now on for d before sending it on; 0 lets
// writes through at once again (those already held keep their delay).
func (p *APIProxy) SetWriteDelay(d time.Duration) { p.delay.Store(int64(d)) }

// HeldWrites returns how many writes the proxy has held so far.
func (p *APIProxy) HeldWrites() int64 { return p.held.Load() }

// Close stops the proxy: it stops listening, closes every connection and drops the writes it holds.
// It is idempotent.
func (p *APIProxy) Close() {
	p.cancel()
	_ = p.srv.Close()
}

// ServeHTTP passes r on to the API server, after the write delay when r is a write.
func (p *APIProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d := time.Duration(p.delay.Load())
	if d <= 0 || !isWrite(r.Method) {
		p.rp.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "API proxy: read the request: "+err.Error(), http.StatusBadGateway)
		return
	}
	p.held.Add(1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.ctx.Done():
		http.Error(w, "API proxy: closed", http.StatusServiceUnavailable)
		return
	case <-t.C:
	}
	// The client may have given up meanwhile: send the write on anyway, on the proxy's own
	// context (one with a deadline, so that the reverse proxy does not cancel it when the
	// client's connection closes).
	ctx, cancel := context.WithTimeout(p.ctx, forwardTimeout)
	defer cancel()
	out := r.Clone(ctx)
	out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	p.rp.ServeHTTP(w, out)
}

// isWrite reports whether method changes what the API server stores.
func isWrite(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// APIProxy returns the proxy between the extenders and the API server, or an error when the
// cluster was started without Options.APIProxy.
func (c *Cluster) APIProxy() (*APIProxy, error) {
	if c.proxy == nil {
		return nil, errors.New("the cluster runs no API proxy: start it with Options.APIProxy")
	}
	return c.proxy, nil
}

package extender

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/internal/keypair"
)

// Server timeouts. Requests are small and answered from memory, except a
// Filter without nodeCacheCapable (up to MaxRequestBytes) and Bind (up to
// Config.BindTimeout).
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 60 * time.Second
	idleTimeout       = 120 * time.Second
	shutdownTimeout   = 10 * time.Second
)

// Run listens on Config.Address and serves until ctx ends; see Serve.
func (s *Scheduler) Run(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.cfg.Address)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Address, err)
	}
	return s.Serve(ctx, ln)
}

// Serve runs WatchCluster and serves Handler on ln, over TLS when
// Config.TLSCertFile is set (the pair is read at start, which fails on a bad
// pair, and again whenever either file changes), and /healthz, /readyz and
// /metrics on Config.HealthAddress when set. When ctx ends it stops accepting, lets
// requests in flight finish for up to 10 s, and returns nil; it returns an
// error when it cannot start or a server or the informers fail. It closes
// ln.
func (s *Scheduler) Serve(ctx context.Context, ln net.Listener) error {
	logger := klog.FromContext(ctx)
	api, err := s.apiServer(ctx, ln, logger)
	if err != nil {
		_ = ln.Close()
		return err
	}
	servers := []*served{api}
	if s.cfg.HealthAddress != "" {
		var lc net.ListenConfig
		hln, err := lc.Listen(ctx, "tcp", s.cfg.HealthAddress)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("listen on %s: %w", s.cfg.HealthAddress, err)
		}
		servers = append(servers, &served{srv: newHTTPServer(ctx, s.healthHandler()), ln: hln})
	}

	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Every goroutine reports once; the first error wins.
	done := make(chan error, len(servers)+1)
	go func() {
		err := s.WatchCluster(ctx)
		if err == nil && parent.Err() == nil {
			err = errors.New("informers stopped")
		}
		done <- err
	}()
	for _, sv := range servers {
		logger.Info("Serving", "address", sv.ln.Addr().String(), "tls", sv.srv.TLSConfig != nil)
		go func() {
			err := sv.srv.Serve(sv.ln)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			} else {
				err = fmt.Errorf("serve on %s: %w", sv.ln.Addr(), err)
			}
			done <- err
		}()
	}

	var first error
	pending := len(servers) + 1
	select {
	case <-ctx.Done():
	case first = <-done:
		pending--
	}
	cancel()
	shutdownCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer stop()
	for _, sv := range servers {
		if err := sv.srv.Shutdown(shutdownCtx); err != nil && first == nil {
			first = fmt.Errorf("shutdown: %w", err)
		}
	}
	for ; pending > 0; pending-- {
		if err := <-done; err != nil && first == nil && parent.Err() == nil {
			first = err
		}
	}
	logger.Info("Stopped serving")
	return first
}

// served is one HTTP server and its listener.
type served struct {
	srv *http.Server
	ln  net.Listener
}

// apiServer is the server of Handler on ln, with TLS when configured.
func (s *Scheduler) apiServer(ctx context.Context, ln net.Listener, logger klog.Logger) (*served, error) {
	srv := newHTTPServer(ctx, s.Handler())
	if s.cfg.TLSCertFile == "" {
		return &served{srv: srv, ln: ln}, nil
	}
	certs, err := keypair.Load(s.cfg.TLSCertFile, s.cfg.TLSKeyFile)
	if err != nil {
		return nil, err
	}
	srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return certs.Current(logger), nil
	}}
	if s.cfg.ClientCAFile != "" {
		pool, err := loadCAs(s.cfg.ClientCAFile)
		if err != nil {
			return nil, err
		}
		// Verified when given; the API endpoints require one (Handler),
		// probes of /healthz and /readyz need none.
		srv.TLSConfig.ClientCAs, srv.TLSConfig.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return &served{srv: srv, ln: tls.NewListener(ln, srv.TLSConfig)}, nil
}

func newHTTPServer(ctx context.Context, h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		IdleTimeout:       idleTimeout,
		// Requests in flight when ctx ends may finish (a bind must not be
		// cut between its patch and its Binding); Shutdown bounds the wait.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
}

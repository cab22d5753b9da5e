package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/internal/keypair"
)

// Timeouts of the HTTPS server. The API server waits at most 30 s for a
// webhook (timeoutSeconds), so nothing legitimate takes longer.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	// shutdownTimeout bounds the wait for requests in flight at shutdown.
	shutdownTimeout = 15 * time.Second
)

// Server is the webhook's HTTPS server: NewHandler's routes behind TLS with
// the certificate of ServerConfig.TLSCertFile and TLSKeyFile. Both files are
// read again on every TLS handshake and taken in when their contents change
// and parse together, so a renewed certificate (a rewritten file or a
// Secret volume's ..data symlink swapped by the kubelet) is served from the
// next handshake on, without a restart; connections already open keep the
// certificate they began with. A pair that does not parse is logged and the
// previous one kept. GET ReadyzPath answers 503 while the certificate in use
// is outside its validity period. GET MetricsPath serves the Server's
// metrics, one registry for every listener it serves on.
type Server struct {
	cfg       ServerConfig
	templates Templates
	keyPair   *keypair.Files
	metrics   *metrics
}

// NewServer validates cfg, loads its certificate once and creates the
// Server's metrics registry (with the Go runtime and process collectors).
// Its error wraps the *vgpu.FieldError of each invalid field, an
// unreadable certificate or key file, or a certificate that does not match
// its key, included.
func NewServer(cfg ServerConfig) (*Server, error) {
	return NewServerWithTemplates(cfg, nil)
}

// NewServerWithTemplates is NewServer whose pods converted to claims
// (Config.DRA) get their template from templates; it returns
// ErrNoTemplates when cfg.DRA.Enabled and templates is nil.
func NewServerWithTemplates(cfg ServerConfig, templates Templates) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	if cfg.DRA.Enabled && templates == nil {
		return nil, ErrNoTemplates
	}
	keyPair, err := keypair.Load(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	m, err := newMetrics()
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, templates: templates, keyPair: keyPair, metrics: m}, nil
}

// Run listens on ServerConfig.Address and serves until ctx is done; see
// Serve.
func (s *Server) Run(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.cfg.Address)
	if err != nil {
		return fmt.Errorf("webhook: listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves HTTPS on ln, which it closes, until ctx is done; then it
// stops accepting connections, waits up to 15 s for requests in flight and
// returns nil. It returns an error when serving fails or requests are still
// running after that wait. It logs with ctx's klog logger. A Server may
// serve on several listeners at once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	logger := klog.FromContext(ctx)
	srv := &http.Server{
		Handler: newRouter(s.cfg.Config, s.templates, func() error { return s.keyPair.Ready(logger, time.Now()) }, s.metrics),
		TLSConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return s.keyPair.Current(logger), nil
			},
		},
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		// Requests carry ctx's logger, but are not cancelled with it:
		// Shutdown lets them finish.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:    log.New(errorLogWriter{logger: logger}, "", 0),
	}

	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	logger.Info("Serving the gpuslice webhook", "address", ln.Addr().String(), "path", MutatePath,
		"schedulerName", s.cfg.SchedulerName, "excludedNamespaces", s.cfg.ExcludedNamespaces)
	select {
	case err := <-served:
		return fmt.Errorf("webhook: serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}

	logger.Info("Shutting down the gpuslice webhook")
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	if serveErr := <-served; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("webhook: shut down: %w", err)
	}
	return nil
}

// errorLogWriter sends net/http's error log (TLS handshake failures, such as
// an API server whose caBundle does not match, and panics in handlers) to a
// klog logger, one entry per line.
type errorLogWriter struct {
	logger klog.Logger
}

func (w errorLogWriter) Write(p []byte) (int, error) {
	w.logger.Info("HTTP server error", "msg", strings.TrimSpace(string(p)))
	return len(p), nil
}

package webhook_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/webhook"
	"github.com/gpuslice/gpuslice/webhook/webhooktest"
)

// serve starts srv on a loopback port and returns its address; the test's
// cleanup stops it and checks that Serve returned nil.
func serve(t *testing.T, srv *webhook.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Serve still running 30s after its context ended")
		}
	})
	return ln.Addr().String()
}

// servedSerial opens a new TLS connection to addr, trusting only ca, and
// returns the serial number of the certificate the server presents. at,
// when not zero, is the time the client checks validity against.
func servedSerial(t *testing.T, addr string, ca *webhooktest.CA, at time.Time) string {
	t.Helper()
	cfg := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if !at.IsZero() {
		cfg.Time = func() time.Time { return at }
	}
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// keyPairDir is where a test keeps its certificate and key files.
type keyPairDir interface {
	CertFile() string
	KeyFile() string
	Write(t testing.TB, pair webhooktest.KeyPair)
}

// plainFiles rewrites the two files in place, one after the other, as a
// careless operator or tool would. Between the two writes the certificate
// does not match the key, and check, when set, is called with the serial of
// the last complete, valid pair, which must still be served then.
type plainFiles struct {
	dir   string
	check func(wantSerial string)
	last  string
}

func (p *plainFiles) CertFile() string { return filepath.Join(p.dir, "tls.crt") }
func (p *plainFiles) KeyFile() string  { return filepath.Join(p.dir, "tls.key") }

func (p *plainFiles) Write(t testing.TB, pair webhooktest.KeyPair) {
	t.Helper()
	if err := os.WriteFile(p.CertFile(), pair.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if p.check != nil && p.last != "" {
		p.check(p.last)
	}
	if err := os.WriteFile(p.KeyFile(), pair.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM); err == nil {
		p.last = pair.Cert.SerialNumber.String()
	}
}

// TestServerReloadsCertificate replaces the key pair under a running Server
// and checks that the next TLS handshake presents the new certificate: with
// the kubelet's symlink swap of a Secret volume, and with files rewritten in
// place, where the half-written state (new certificate, old key) must keep
// the old pair in use and a broken file must never stop the server.
func TestServerReloadsCertificate(t *testing.T) {
	tests := []struct {
		name  string
		files func(t *testing.T, check func(wantSerial string)) keyPairDir
	}{{
		name: "secret volume: ..data symlink swapped",
		files: func(t *testing.T, _ func(string)) keyPairDir {
			return webhooktest.NewSecretVolume(t)
		},
	}, {
		name: "files rewritten in place",
		files: func(t *testing.T, check func(string)) keyPairDir {
			return &plainFiles{dir: t.TempDir(), check: check}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ca := webhooktest.NewCA(t)
			var addr string
			check := func(want string) {
				t.Helper()
				if got := servedSerial(t, addr, ca, time.Time{}); got != want {
					t.Errorf("served certificate serial %s, want %s", got, want)
				}
			}
			files := tt.files(t, check)
			first := ca.Serving(t)
			files.Write(t, first)
			cfg := webhook.DefaultServerConfig()
			cfg.TLSCertFile, cfg.TLSKeyFile = files.CertFile(), files.KeyFile()
			srv, err := webhook.NewServer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			addr = serve(t, srv)
			check(first.Cert.SerialNumber.String())

			second := ca.Serving(t)
			files.Write(t, second)
			check(second.Cert.SerialNumber.String())

			broken := webhooktest.KeyPair{CertPEM: []byte("not a certificate"), KeyPEM: second.KeyPEM}
			files.Write(t, broken)
			check(second.Cert.SerialNumber.String())

			third := ca.Serving(t)
			files.Write(t, third)
			check(third.Cert.SerialNumber.String())

			// HTTP works over the reloaded certificate.
			client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}
			defer client.CloseIdleConnections()
			resp, err := client.Get("https://" + addr + webhook.HealthzPath)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET /healthz: %s", resp.Status)
			}
		})
	}
}

// TestServerReadyz checks that readiness follows the validity period of
// the certificate in use, including one renewed while serving.
func TestServerReadyz(t *testing.T) {
	ca := webhooktest.NewCA(t)
	volume := webhooktest.NewSecretVolume(t)
	now := time.Now()
	expired := ca.Issue(t, now.Add(-50*time.Minute), now.Add(-10*time.Minute))
	volume.Write(t, expired)
	cfg := webhook.DefaultServerConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile = volume.CertFile(), volume.KeyFile()
	srv, err := webhook.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, srv)

	get := func(clientTime time.Time) (int, string) {
		t.Helper()
		tlsConfig := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12, Time: func() time.Time { return clientTime }}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}
		defer client.CloseIdleConnections()
		resp, err := client.Get("https://" + addr + webhook.ReadyzPath)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	// A client whose clock lies within the expired certificate's validity
	// can still ask.
	code, body := get(now.Add(-30 * time.Minute))
	want := "not ready: the serving certificate (serial " + expired.Cert.SerialNumber.String() + ") expired at " +
		expired.Cert.NotAfter.UTC().Format(time.RFC3339)
	if diff := cmp.Diff([]any{http.StatusServiceUnavailable, want}, []any{code, body}); diff != "" {
		t.Errorf("readyz with an expired certificate (-want +got):\n%s", diff)
	}

	volume.Write(t, ca.Serving(t))
	code, body = get(time.Now())
	if diff := cmp.Diff([]any{http.StatusOK, "ok"}, []any{code, body}); diff != "" {
		t.Errorf("readyz after renewal (-want +got):\n%s", diff)
	}
}

func TestNewServerErrors(t *testing.T) {
	ca := webhooktest.NewCA(t)
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	a, b := ca.Serving(t), ca.Serving(t)
	certA, keyA, keyB := write("a.crt", a.CertPEM), write("a.key", a.KeyPEM), write("b.key", b.KeyPEM)
	missing := filepath.Join(dir, "missing.crt")

	tests := []struct {
		name      string
		cfg       func(*webhook.ServerConfig)
		wantField string
		want      []string // substrings of the error
	}{
		{"bad address", func(c *webhook.ServerConfig) { c.Address = "9443" }, "address", []string{`address="9443"`, "host:port"}},
		{"bad scheduler name", func(c *webhook.ServerConfig) { c.SchedulerName = "" }, "schedulerName", []string{`schedulerName=""`}},
		{"missing certificate file", func(c *webhook.ServerConfig) { c.TLSCertFile = missing }, "tlsCertFile", []string{"tlsCertFile", "missing.crt", "no such file"}},
		{"missing key file", func(c *webhook.ServerConfig) { c.TLSKeyFile = missing }, "tlsKeyFile", []string{"tlsKeyFile", "missing.crt"}},
		{"key of another certificate", func(c *webhook.ServerConfig) { c.TLSKeyFile = keyB }, "tlsCertFile", []string{"tlsCertFile", "b.key", "private key does not match public key"}},
		{"key as certificate", func(c *webhook.ServerConfig) { c.TLSCertFile = keyA }, "tlsCertFile", []string{"tlsCertFile", "a.key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := webhook.DefaultServerConfig()
			cfg.TLSCertFile, cfg.TLSKeyFile = certA, keyA
			tt.cfg(&cfg)
			_, err := webhook.NewServer(cfg)
			var fieldErr *vgpu.FieldError
			if !errors.As(err, &fieldErr) || fieldErr.Field != tt.wantField {
				t.Fatalf("NewServer: %v; want a *vgpu.FieldError for %s", err, tt.wantField)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestRun checks Run's lifetime: it fails at once on an address in use,
// and returns nil soon after its context ends.
func TestRun(t *testing.T) {
	ca := webhooktest.NewCA(t)
	volume := webhooktest.NewSecretVolume(t)
	volume.Write(t, ca.Serving(t))
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := webhook.DefaultServerConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile = volume.CertFile(), volume.KeyFile()
	cfg.Address = busy.Addr().String()
	srv, err := webhook.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	if err := srv.Run(ctx); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("Run on a busy address: got %v, want address already in use", err)
	}

	// A free port: pick one, release it, run there.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Address = free.Addr().String()
	_ = free.Close()
	if srv, err = webhook.NewServer(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	// Wait until it serves, with a deadline.
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("Run returned early: %w", err)
		default:
		}
		conn, err := tls.Dial("tcp", cfg.Address, &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12})
		if err != nil {
			return false, nil
		}
		_ = conn.Close()
		return true, nil
	})
	if err != nil {
		t.Fatalf("Run not serving on %s: %v", cfg.Address, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after its context ended: %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Run still running 30s after its context ended")
	}
}

package extender

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2/ktesting"
)

func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

// writePair writes a certificate pair and moves its mtime to at, so a
// rewrite within the file system's time resolution is still seen.
func writePair(t *testing.T, certFile, keyFile string, certPEM, keyPEM []byte, at time.Time) {
	t.Helper()
	for _, f := range []struct {
		path string
		data []byte
	}{{certFile, certPEM}, {keyFile, keyPEM}} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f.path, at, at); err != nil {
			t.Fatal(err)
		}
	}
}

// TestServeTLS serves over HTTPS, swaps the certificate files, and checks
// that new connections get the new certificate, that a broken pair keeps
// the last good one, and that Serve returns nil once ctx ends.
func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	certA, keyA := selfSigned(t)
	certB, keyB := selfSigned(t)
	writePair(t, certFile, keyFile, certA, keyA, now)

	cfg := testConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile = certFile, keyFile
	addr, stop := serve(t, cfg)

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certA)
	pool.AppendCertsFromPEM(certB)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}
	url := "https://" + addr + "/readyz"
	served := func() []byte {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		_ = resp.Body.Close()
		return resp.TLS.PeerCertificates[0].Raw
	}
	der := func(p []byte) []byte {
		b, _ := pem.Decode(p)
		return b.Bytes
	}
	waitFor(t, "/readyz over TLS", func() bool {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !bytes.Equal(served(), der(certA)) {
		t.Error("first certificate not served")
	}
	writePair(t, certFile, keyFile, certB, keyB, now.Add(time.Hour))
	if !bytes.Equal(served(), der(certB)) {
		t.Error("certificate not reloaded after the files changed")
	}
	writePair(t, certFile, keyFile, []byte("garbage"), keyB, now.Add(2*time.Hour))
	if !bytes.Equal(served(), der(certB)) {
		t.Error("a broken pair replaced the last good certificate")
	}

	if err := stop(); err != nil {
		t.Errorf("Serve after cancel: %v", err)
	}
}

// TestServeBadCertificate checks that a pair that cannot be read stops
// Serve at once with an error naming the file.
func TestServeBadCertificate(t *testing.T) {
	cfg := testConfig()
	cfg.TLSCertFile = filepath.Join(t.TempDir(), "missing.crt")
	cfg.TLSKeyFile = filepath.Join(t.TempDir(), "missing.key")
	s, err := New(cfg, Options{Client: fake.NewClientset()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = s.Serve(t.Context(), ln)
	if err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Errorf("Serve: %v, want an error naming missing.crt", err)
	}
}

// clientPair returns a CA and, per common name, a client certificate it
// signed, as tls material.
func clientPair(t *testing.T, commonNames ...string) (caPEM []byte, clients []tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	for i, cn := range commonNames {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i) + 2), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key})
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), clients
}

// TestServeClientCA checks that with clientCAFile the API endpoints
// require a client certificate from that CA with an allowed subject, while
// probes stay open.
func TestServeClientCA(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	serverCert, serverKey := selfSigned(t)
	writePair(t, certFile, keyFile, serverCert, serverKey, now)
	caPEM, clients := clientPair(t, "kube-scheduler", "some-other-client")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile, cfg.ClientCAFile = certFile, keyFile, caFile
	cfg.AllowedClientNames = []string{"kube-scheduler"}
	addr, _ := serve(t, cfg)

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(serverCert)
	clientFor := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12},
		}}
	}
	base := "https://" + addr
	status := func(c *http.Client, method, path string) int {
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			return -1
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	anonymous, scheduler, other := clientFor(), clientFor(clients[0]), clientFor(clients[1])
	waitFor(t, "/healthz over TLS", func() bool { return status(anonymous, http.MethodGet, "/healthz") == http.StatusOK })
	for _, tt := range []struct {
		name   string
		client *http.Client
		path   string
		want   int
	}{
		{"anonymous filter", anonymous, "/filter", http.StatusForbidden},
		{"anonymous bind", anonymous, "/bind", http.StatusForbidden},
		{"same CA, subject not allowed: bind", other, "/bind", http.StatusForbidden},
		{"same CA, subject not allowed: filter", other, "/filter", http.StatusForbidden},
		{"scheduler filter", scheduler, "/filter", http.StatusBadRequest}, // past the check: "{}" lacks a Pod
		{"scheduler bind", scheduler, "/bind", http.StatusBadRequest},
	} {
		if got := status(tt.client, http.MethodPost, tt.path); got != tt.want {
			t.Errorf("%s: HTTP %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestServeHealthAddress checks that HealthAddress serves the probes, and
// only them, beside the API listener.
func TestServeHealthAddress(t *testing.T) {
	srv := serveWithHealth(t)
	if code, _ := postRaw(t, srv.health+"/filter", "application/json", []byte("{}"), nil); code != http.StatusNotFound {
		t.Errorf("/filter on the health address: HTTP %d, want 404", code)
	}
	if code, _ := postRaw(t, srv.api+"/filter", "application/json", []byte("{}"), nil); code != http.StatusBadRequest {
		t.Errorf("/filter on the API address: HTTP %d, want 400", code)
	}
	if err := srv.stop(); err != nil {
		t.Errorf("Serve after cancel: %v", err)
	}
}

// servingScheduler is a Scheduler serving its API and health listeners.
type servingScheduler struct {
	api, health string // base URLs
	stop        func() error
}

// serveWithHealth serves a Scheduler with a HealthAddress on loopback until
// the test ends (or stop), and waits for /readyz on the health listener.
func serveWithHealth(t *testing.T) *servingScheduler {
	t.Helper()
	free, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	healthAddr := free.Addr().String()
	_ = free.Close()
	cfg := testConfig()
	cfg.HealthAddress = healthAddr
	addr, stop := serve(t, cfg)
	srv := &servingScheduler{api: "http://" + addr, health: "http://" + healthAddr, stop: stop}
	waitFor(t, "/readyz on the health address", func() bool {
		code, _ := getNoFail(srv.health + "/readyz")
		return code == http.StatusOK
	})
	return srv
}

// serve runs Serve of a new Scheduler for cfg (on a fake clientset) on a
// loopback port and returns that port's address and stop, which ends Serve
// and returns its error; later calls return the same error. Unless the
// test called stop, its cleanup does and reports an error.
func serve(t *testing.T, cfg Config) (addr string, stop func() error) {
	t.Helper()
	s, err := New(cfg, Options{Client: fake.NewClientset()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	var once sync.Once
	var serveErr error
	halt := func() { cancel(); serveErr = <-done }
	t.Cleanup(func() {
		halted := false
		once.Do(func() { halt(); halted = true })
		if halted && serveErr != nil {
			t.Errorf("Serve: %v", serveErr)
		}
	})
	return ln.Addr().String(), func() error {
		once.Do(halt)
		return serveErr
	}
}

// TestDefaultAddressRefusesOutsideCallers runs the extender on the host of
// DefaultAddress and sends an unauthenticated /bind to one of this
// machine's other addresses, as a caller outside the pod would: nothing
// listens there. The same request on loopback reaches the handler.
func TestDefaultAddressRefusesOutsideCallers(t *testing.T) {
	host, _, err := net.SplitHostPort(DefaultAddress)
	if err != nil {
		t.Fatal(err)
	}
	outside := ""
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			outside = ipn.IP.String()
			break
		}
	}
	if outside == "" {
		t.Skip("this machine has no non-loopback IPv4 address to call from")
	}
	free, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(free.Addr().String())
	_ = free.Close()

	cfg := DefaultConfig()
	cfg.Address = net.JoinHostPort(host, port)
	s, err := New(cfg, Options{Client: fake.NewClientset()})
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	client := &http.Client{Timeout: 5 * time.Second}
	bind := func(host string) (int, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+net.JoinHostPort(host, port)+"/bind", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	waitFor(t, "the extender on "+cfg.Address, func() bool {
		code, err := bind(host)
		return err == nil && code == http.StatusBadRequest // reached: "{}" lacks the pod
	})
	code, err := bind(outside)
	if err == nil {
		t.Fatalf("POST /bind on %s: HTTP %d; want the connection refused (DefaultAddress %s must not listen beyond loopback)", outside, code, DefaultAddress)
	}
	t.Logf("POST /bind on %s: %v", outside, err)
}

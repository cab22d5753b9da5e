package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuslice/gpuslice/webhook"
	"github.com/gpuslice/gpuslice/webhook/webhooktest"
)

// buildBinary builds the command into a temporary folder.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gpuslice-webhook")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestBadStart runs the real binary the way a user would and checks that
// every start-up failure is one clear line on stderr naming the field, with
// exit code 2, never a panic or a stack trace.
func TestBadStart(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	write := func(name, data string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	badFile := write("bad.yaml", "schedulerName: gpu\nexcludedNamespace: [a]\n")
	ca := webhooktest.NewCA(t)
	pair := ca.Serving(t)
	certFile, keyFile := write("tls.crt", string(pair.CertPEM)), write("tls.key", string(pair.KeyPEM))
	certs := []string{"--tls-cert-file=" + certFile, "--tls-key-file=" + keyFile}

	tests := []struct {
		name string
		args []string
		want []string // substrings of the one stderr line
	}{
		{name: "no certificate", args: nil, want: []string{`tlsCertFile=""`, `tlsKeyFile=""`, "required"}},
		{name: "bad address", args: append([]string{"--address=9443"}, certs...), want: []string{`address="9443"`, "host:port"}},
		{name: "stock scheduler", args: append([]string{"--scheduler-name=default-scheduler"}, certs...), want: []string{"schedulerName", "default-scheduler"}},
		{name: "bad excluded namespace", args: append([]string{"--excluded-namespaces=kube-system,Team A"}, certs...), want: []string{"excludedNamespaces", "Team A"}},
		{name: "missing certificate file", args: []string{"--tls-cert-file=" + filepath.Join(dir, "none.crt"), "--tls-key-file=" + keyFile}, want: []string{"tlsCertFile", "none.crt"}},
		{name: "key does not match", args: []string{"--tls-cert-file=" + certFile, "--tls-key-file=" + certFile}, want: []string{"tlsCertFile", "tlsKeyFile"}},
		{name: "unknown field in config file", args: append([]string{"--config=" + badFile}, certs...), want: []string{"excludedNamespace"}},
		{name: "stray argument", args: append([]string{"extra"}, certs...), want: []string{"extra"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, tt.args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			cmd.WaitDelay = 10 * time.Second
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("exit: %v, want exit code 2\nstderr:\n%s", err, stderr.String())
			}
			if exit.ExitCode() != 2 {
				t.Errorf("exit code %d, want 2\nstderr:\n%s", exit.ExitCode(), stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 {
				t.Errorf("stderr has %d lines, want 1:\n%s", len(lines), stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(lines[len(lines)-1], w) {
					t.Errorf("error line %q does not mention %q", lines[len(lines)-1], w)
				}
			}
		})
	}
}

// TestServeAndStop starts the binary, waits until it answers /readyz over
// TLS and sends SIGTERM: it must stop cleanly with exit code 0.
func TestServeAndStop(t *testing.T) {
	bin := buildBinary(t)
	volume := webhooktest.NewSecretVolume(t)
	ca := webhooktest.NewCA(t)
	volume.Write(t, ca.Serving(t))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // Another process may take the port; unlikely on loopback.

	cmd := exec.Command(bin, "--address="+addr, "--tls-cert-file="+volume.CertFile(), "--tls-key-file="+volume.KeyFile())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()
	err = wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-exited:
			return false, errors.Join(errors.New("exited early"), err)
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+webhook.ReadyzPath, nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("webhook not ready on %s: %v\nstderr:\n%s", addr, err, stderr.String())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v, want 0\nstderr:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30s after SIGTERM\nstderr:\n%s", stderr.String())
	}
}

// TestFlagsOverrideConfigFile checks the precedence: defaults, then the
// --config file, then flags given on the command line, wherever --config
// stands among them.
func TestFlagsOverrideConfigFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "webhook.yaml")
	if err := os.WriteFile(file, []byte("address: 127.0.0.1:8443\ntlsCertFile: /file/tls.crt\ntlsKeyFile: /file/tls.key\nschedulerName: from-file\nexcludedNamespaces: [a]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := parseFlags("test", []string{"--tls-key-file=/flag/tls.key", "--config=" + file, "--excluded-namespaces=kube-system, gpuslice"})
	if err != nil {
		t.Fatal(err)
	}
	want := webhook.ServerConfig{
		Config:      webhook.Config{SchedulerName: "from-file", ExcludedNamespaces: []string{"kube-system", "gpuslice"}},
		Address:     "127.0.0.1:8443",
		TLSCertFile: "/file/tls.crt",
		TLSKeyFile:  "/flag/tls.key",
	}
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}

	cfg, _, err = parseFlags("test", []string{"--tls-cert-file=c", "--tls-key-file=k", "--excluded-namespaces="})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ExcludedNamespaces != nil || cfg.Address != webhook.DefaultAddress || cfg.SchedulerName != webhook.DefaultSchedulerName {
		t.Errorf("defaults with --excluded-namespaces= : got %+v, want no excluded namespace and default address and scheduler", cfg)
	}
}

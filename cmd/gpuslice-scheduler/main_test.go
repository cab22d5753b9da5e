package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/vgpu"
)

// TestBadStart checks that every configuration error ends the process with
// exit code 2 and one line on stderr naming the field and what is allowed,
// before any cluster is contacted.
func TestBadStart(t *testing.T) {
	dir := t.TempDir()
	badFile := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badFile, []byte("nodePolicy: spread\nheartbeatAge: 1m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want []string // substrings of the one stderr line
	}{
		{"node policy", []string{"--node-policy=pack"}, []string{"nodePolicy", `"pack"`, "binpack, spread, fragmentation"}},
		{"GPU policy", []string{"--gpu-policy=best"}, []string{"gpuPolicy", "binpack, spread, fragmentation"}},
		{"two errors", []string{"--node-policy=a", "--gpu-policy=b"}, []string{"nodePolicy", "; ", "gpuPolicy"}},
		{"heartbeat age", []string{"--heartbeat-max-age=0s"}, []string{"heartbeatMaxAge", "at least 1s"}},
		{"cert without key", []string{"--tls-cert-file=tls.crt"}, []string{"tlsKeyFile", "required"}},
		{"address", []string{"--address=8888"}, []string{"address", "host:port"}},
		{"unknown field in config file", []string{"--config=" + badFile}, []string{"heartbeatAge"}},
		{"missing config file", []string{"--config=" + filepath.Join(dir, "none.yaml")}, []string{"none.yaml"}},
		{"unknown flag", []string{"--policy=binpack"}, []string{"policy"}},
		{"stray argument", []string{"extra"}, []string{"extra"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(tt.args, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2\nstderr:\n%s", code, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			last := lines[len(lines)-1]
			for _, w := range tt.want {
				if !strings.Contains(last, w) {
					t.Errorf("error line %q does not mention %q", last, w)
				}
			}
		})
	}
}

// TestFlagsOverrideConfigFile checks the precedence: defaults, then the
// --config file, then flags given on the command line, wherever --config
// appears among them.
func TestFlagsOverrideConfigFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("nodePolicy: spread\ngpuPolicy: spread\nheartbeatMaxAge: 2m\naddress: 127.0.0.1:9000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cfg, kubeconfig, err := parseFlags([]string{"--gpu-policy=fragmentation", "--config=" + file, "--kubeconfig=kc", "--bind-timeout=3s"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	want := extender.DefaultConfig()
	want.NodePolicy = vgpu.PolicySpread
	want.GPUPolicy = vgpu.PolicyFragmentation
	want.HeartbeatMaxAge.Duration = 2 * time.Minute
	want.Address = "127.0.0.1:9000"
	want.BindTimeout.Duration = 3 * time.Second
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if kubeconfig != "kc" {
		t.Errorf("kubeconfig %q, want kc", kubeconfig)
	}
}

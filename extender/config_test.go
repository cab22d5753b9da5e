package extender

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	tests := []struct {
		name   string
		modify func(*Config)
		want   []string // fields named, in order
	}{
		{"address without port", func(c *Config) { c.Address = "localhost" }, []string{"address"}},
		{"address port too high", func(c *Config) { c.Address = ":70000" }, []string{"address"}},
		{"health address", func(c *Config) { c.HealthAddress = "8889" }, []string{"healthAddress"}},
		{"health address is address", func(c *Config) { c.HealthAddress = c.Address }, []string{"healthAddress"}},
		{"cert without key", func(c *Config) { c.TLSCertFile = "tls.crt" }, []string{"tlsKeyFile"}},
		{"key without cert", func(c *Config) { c.TLSKeyFile = "tls.key" }, []string{"tlsCertFile"}},
		{"client CA without TLS", func(c *Config) { c.ClientCAFile, c.AllowedClientNames = "ca.crt", []string{"kube-scheduler"} }, []string{"clientCAFile"}},
		{"client CA without allowed names", func(c *Config) { c.TLSCertFile, c.TLSKeyFile, c.ClientCAFile = "tls.crt", "tls.key", "ca.crt" }, []string{"allowedClientNames"}},
		{"allowed names without client CA", func(c *Config) { c.AllowedClientNames = []string{"kube-scheduler"} }, []string{"allowedClientNames"}},
		{"every interface without client certificates", func(c *Config) { c.Address = ":8888" }, []string{"address"}},
		{"a pod IP without client certificates", func(c *Config) { c.Address = "10.0.0.7:8888" }, []string{"address"}},
		{"every interface with TLS but no client CA", func(c *Config) { c.Address, c.TLSCertFile, c.TLSKeyFile = "0.0.0.0:8888", "tls.crt", "tls.key" }, []string{"address"}},
		{"node policy", func(c *Config) { c.NodePolicy = "pack" }, []string{"nodePolicy"}},
		{"empty GPU policy", func(c *Config) { c.GPUPolicy = "" }, []string{"gpuPolicy"}},
		{"heartbeat age", func(c *Config) { c.HeartbeatMaxAge = metav1.Duration{} }, []string{"heartbeatMaxAge"}},
		{"namespace", func(c *Config) { c.HeartbeatNamespace = "Kube_Node_Lease" }, []string{"heartbeatNamespace"}},
		{"resource name", func(c *Config) { c.ResourceName = "gpu" }, []string{"resourceName"}},
		{"bind timeout", func(c *Config) { c.BindTimeout = metav1.Duration{Duration: time.Hour} }, []string{"bindTimeout"}},
		{"bind outcome wait below bind timeout", func(c *Config) { c.BindOutcomeWait = metav1.Duration{Duration: time.Second} }, []string{"bindOutcomeWait"}},
		{"bind outcome wait unset", func(c *Config) { c.BindOutcomeWait = metav1.Duration{} }, []string{"bindOutcomeWait"}},
		{"gc percent", func(c *Config) { c.GCPercent = 0 }, []string{"gcPercent"}},
		{"several at once", func(c *Config) { c.NodePolicy, c.GPUPolicy = "x", "y" }, []string{"nodePolicy", "gpuPolicy"}},
	}
	for _, ok := range []func(*Config){
		func(c *Config) { c.Address = "localhost:8888" },
		func(c *Config) { c.Address = "[::1]:8888" },
		func(c *Config) {
			c.Address, c.TLSCertFile, c.TLSKeyFile, c.ClientCAFile, c.AllowedClientNames = ":8888", "tls.crt", "tls.key", "ca.crt", []string{"kube-scheduler"}
		},
	} {
		cfg := DefaultConfig()
		ok(&cfg)
		if err := cfg.Validate(); err != nil {
			t.Errorf("address %s: %v, want valid", cfg.Address, err)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.modify(&cfg)
			err := cfg.Validate()
			var got []string
			for _, e := range unjoin(err) {
				var fe *vgpu.FieldError
				if !errors.As(e, &fe) {
					t.Fatalf("error %v is not a *vgpu.FieldError", e)
				}
				if fe.Allowed == "" {
					t.Errorf("%s: no allowed values", fe.Field)
				}
				got = append(got, fe.Field)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("fields (-want +got):\n%s", diff)
			}
		})
	}
	cfg := DefaultConfig()
	cfg.NodePolicy = "pack"
	if msg := cfg.Validate().Error(); !strings.Contains(msg, "binpack, spread, fragmentation") {
		t.Errorf("policy error %q does not list the policies", msg)
	}
}

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func TestLoadConfigFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("nodePolicy: spread\nheartbeatMaxAge: 90s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfigFile(good, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.NodePolicy = vgpu.PolicySpread
	want.HeartbeatMaxAge = metav1.Duration{Duration: 90 * time.Second}
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("nodePolicey: spread\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfigFile(bad, DefaultConfig()); err == nil || !strings.Contains(err.Error(), "nodePolicey") {
		t.Errorf("unknown field: %v, want an error naming nodePolicey", err)
	}
	if _, err := LoadConfigFile(filepath.Join(dir, "none.yaml"), DefaultConfig()); err == nil {
		t.Error("missing file: no error")
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := New(DefaultConfig(), Options{}); err == nil {
		t.Error("New without a client: no error")
	}
	cfg := DefaultConfig()
	cfg.GPUPolicy = "x"
	if _, err := New(cfg, Options{}); err == nil {
		t.Error("New with an invalid config: no error")
	}
}

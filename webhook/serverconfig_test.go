package webhook_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/webhook"
)

func TestServerConfigValidate(t *testing.T) {
	valid := func(f func(*webhook.ServerConfig)) webhook.ServerConfig {
		c := webhook.DefaultServerConfig()
		c.TLSCertFile, c.TLSKeyFile = "/certs/tls.crt", "/certs/tls.key"
		if f != nil {
			f(&c)
		}
		return c
	}
	const addressRule = "must be host:port with a port from 1 to 65535, e.g. :9443 (every interface) or 127.0.0.1:9443"
	tests := []struct {
		name string
		cfg  webhook.ServerConfig
		want string // "" for valid
	}{
		{"valid", valid(nil), ""},
		{"IPv6 host", valid(func(c *webhook.ServerConfig) { c.Address = "[::1]:443" }), ""},
		{"default has no certificate", webhook.DefaultServerConfig(),
			"invalid config: tlsCertFile=\"\": required: the PEM serving certificate, e.g. tls.crt of a kubernetes.io/tls Secret volume\n" +
				`invalid config: tlsKeyFile="": required: the PEM private key of tlsCertFile, e.g. tls.key of a kubernetes.io/tls Secret volume`},
		{"no port", valid(func(c *webhook.ServerConfig) { c.Address = "0.0.0.0" }), `invalid config: address="0.0.0.0": ` + addressRule},
		{"port 0", valid(func(c *webhook.ServerConfig) { c.Address = ":0" }), `invalid config: address=":0": ` + addressRule},
		{"port too large", valid(func(c *webhook.ServerConfig) { c.Address = ":65536" }), `invalid config: address=":65536": ` + addressRule},
		{"named port", valid(func(c *webhook.ServerConfig) { c.Address = ":https" }), `invalid config: address=":https": ` + addressRule},
		{"decision config checked too", valid(func(c *webhook.ServerConfig) {
			c.SchedulerName, c.ExcludedNamespaces, c.Address = "", []string{"A"}, ""
		}), "invalid config: schedulerName=\"\": required: the scheduler profile that calls the gpuslice extender, e.g. gpuslice-scheduler\n" +
			"invalid config: excludedNamespaces=\"A\": each entry must be a namespace name (lower-case letters, digits and '-', at most 63)\n" +
			`invalid config: address="": ` + addressRule},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if err := tt.cfg.Validate(); err != nil {
				got = err.Error()
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Validate mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadServerConfigFile(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		want    webhook.ServerConfig
		wantErr string // substring; "" for success
	}{{
		name: "all fields, decision fields inline",
		file: "address: 127.0.0.1:8443\ntlsCertFile: /c/tls.crt\ntlsKeyFile: /c/tls.key\nschedulerName: gpu\nexcludedNamespaces: [a, b]\n",
		want: webhook.ServerConfig{
			Config:  webhook.Config{SchedulerName: "gpu", ExcludedNamespaces: []string{"a", "b"}},
			Address: "127.0.0.1:8443", TLSCertFile: "/c/tls.crt", TLSKeyFile: "/c/tls.key",
		},
	}, {
		name: "fields left out keep the defaults; an empty list excludes nothing",
		file: "{\"tlsCertFile\": \"/c/tls.crt\", \"excludedNamespaces\": []}",
		want: webhook.ServerConfig{
			Config:      webhook.Config{SchedulerName: webhook.DefaultSchedulerName, ExcludedNamespaces: []string{}},
			Address:     webhook.DefaultAddress,
			TLSCertFile: "/c/tls.crt",
		},
	}, {
		name:    "unknown field",
		file:    "listen: :443\n",
		wantErr: `unknown field "listen"`,
	}, {
		name:    "wrong type",
		file:    "excludedNamespaces: kube-system\n",
		wantErr: "excludedNamespaces",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "webhook.yaml")
			if err := os.WriteFile(path, []byte(tt.file), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := webhook.LoadServerConfigFile(path, webhook.DefaultServerConfig())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("LoadServerConfigFile: %v, want an error mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("LoadServerConfigFile (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := webhook.LoadServerConfigFile(filepath.Join(t.TempDir(), "none.yaml"), webhook.DefaultServerConfig()); err == nil {
		t.Errorf("LoadServerConfigFile of a missing file: got no error")
	}
}

package kubeclient

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func TestConfigFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Config(path, "gpuslice-test/v1")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:6443" || cfg.BearerToken != "t" || cfg.UserAgent != "gpuslice-test/v1" {
		t.Errorf("config %+v: want the file's server and token and the user agent", cfg)
	}
	if _, err := Config(filepath.Join(t.TempDir(), "missing"), "x"); err == nil {
		t.Error("a missing kubeconfig file gave no error")
	}
}

func TestConfigNotInCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := Config("", "x"); !errors.Is(err, rest.ErrNotInCluster) {
		t.Errorf("outside a cluster: %v, want rest.ErrNotInCluster", err)
	}
}

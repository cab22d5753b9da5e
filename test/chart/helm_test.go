package chart

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/test/cluster"
)

// Fixed inputs of every render: the release, its namespace and the cluster version the chart is
// rendered for (the Kubernetes version this repository builds and tests against).
const (
	releaseName      = "gpuslice"
	releaseNamespace = "gpuslice-system"
	kubeVersion      = "1.37.2"
	// helmTimeout bounds one helm run; a render takes a fraction of a second.
	helmTimeout = time.Minute
)

// chartDir is the chart under test, relative to this package's folder (go test's working
// directory), with forward slashes.
const chartDir = "../../charts/gpuslice"

// helm runs the helm binary with a private home, so that no user configuration, repository or
// kubeconfig of the machine takes part.
type helm struct {
	path string
	home string
}

// requireHelm returns the built helm, or skips t with the reason when it is not built; with
// CI=true it fails t instead, as the e2e tests do.
func requireHelm(t *testing.T) helm {
	t.Helper()
	why := ""
	dir, err := cluster.FindBinDir()
	if err != nil {
		why = err.Error()
	} else if _, err := os.Stat(filepath.Join(dir, "helm")); err != nil {
		why = fmt.Sprintf("helm is not built in %s (run make cluster): %v", dir, err)
	}
	if why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chart: %s (CI=true: not skipping)", why)
		}
		t.Skipf("chart: %s", why)
	}
	return helm{path: filepath.Join(dir, "helm"), home: t.TempDir()}
}

// run runs helm with args and returns its standard output; on a non-zero exit the error holds
// standard error and output.
func (h helm) run(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), helmTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.path, args...) //nolint:gosec // G204: the test's own helm binary and arguments.
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"),
		"KUBECONFIG="+filepath.Join(h.home, "no-kubeconfig"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %v: %w\nstderr:\n%s\nstdout:\n%s", args, err, stderr.String(), stdout.String())
	}
	return stdout.Bytes(), nil
}

// webhookTLSValues gives the webhook a certificate made once: helm template and helm lint have no
// cluster to read, so the chart makes none itself there (it fails instead).
const webhookTLSValues = "testdata/webhook-tls.yaml"

// template renders the chart with webhookTLSValues, then the values file (none when empty).
func (h helm) template(valuesFile string) ([]byte, error) {
	return h.templateWith(webhookTLSValues, valuesFile)
}

// templateWith renders the chart with the values files, in order, skipping empty names.
func (h helm) templateWith(valuesFiles ...string) ([]byte, error) {
	args := []string{"template", releaseName, filepath.FromSlash(chartDir), "--namespace", releaseNamespace, "--kube-version", kubeVersion}
	return h.run(withValues(args, valuesFiles...)...)
}

// lint runs helm lint --strict on the chart with webhookTLSValues, then the values file (none
// when empty).
func (h helm) lint(valuesFile string) ([]byte, error) {
	args := []string{"lint", "--strict", filepath.FromSlash(chartDir), "--namespace", releaseNamespace, "--kube-version", kubeVersion}
	return h.run(withValues(args, webhookTLSValues, valuesFile)...)
}

// withValues appends -f for each non-empty file name.
func withValues(args []string, files ...string) []string {
	for _, f := range files {
		if f != "" {
			args = append(args, "-f", filepath.FromSlash(f))
		}
	}
	return args
}

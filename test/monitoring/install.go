package monitoring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpuslice/gpuslice/test/harness/findup"
)

// Install is a Prometheus installation as hack/install-prometheus.sh leaves it: the
// distribution's package unpacked under Dir.
type Install struct {
	// Dir is the folder the packages were unpacked into (_output/prometheus).
	Dir string
}

// FindInstall returns $GPUSLICE_PROMETHEUS_DIR when set, else the first _output/prometheus found
// in the working directory or one of its parents that holds prometheus and promtool.
func FindInstall() (Install, error) {
	if d := os.Getenv("GPUSLICE_PROMETHEUS_DIR"); d != "" {
		i := Install{Dir: d}
		return i, i.check()
	}
	dir, ok, err := findup.Dir(filepath.Join("_output", "prometheus"), func(d string) bool { return Install{Dir: d}.check() == nil })
	if err != nil || ok {
		return Install{Dir: dir}, err
	}
	return Install{}, errors.New("prometheus and promtool not found in _output/prometheus of the working directory or a parent: run make prometheus (or set GPUSLICE_PROMETHEUS_DIR)")
}

// RequireInstall returns FindInstall's installation, or skips t when there is none; with
// CI=true it fails t instead.
func RequireInstall(t testing.TB) Install {
	t.Helper()
	i, err := FindInstall()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: not skipping)", err)
		}
		t.Skip(err)
	}
	return i
}

// check returns nil when both binaries are there.
func (i Install) check() error {
	for _, p := range []string{i.Prometheus(), i.Promtool()} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("prometheus installation %s: %w (run make prometheus)", i.Dir, err)
		}
	}
	return nil
}

// Prometheus returns the server's path.
func (i Install) Prometheus() string { return filepath.Join(i.Dir, "usr", "bin", "prometheus") }

// Promtool returns promtool's path.
func (i Install) Promtool() string { return filepath.Join(i.Dir, "usr", "bin", "promtool") }

// WebAssets returns the folder of the web UI's assets (the server's --web.local-assets).
func (i Install) WebAssets() string { return filepath.Join(i.Dir, "usr", "share", "prometheus", "web") }

// CheckRules runs promtool check rules on the rule files and returns its output; a non-zero exit
// is an error that holds the output.
func (i Install) CheckRules(ctx context.Context, files ...string) (string, error) {
	return i.promtool(ctx, append([]string{"check", "rules"}, files...)...)
}

// TestRules runs promtool test rules on the unit-test files (promtool's own format, each naming
// its rule files relative to its folder) and returns its output; a failed test is an error that
// holds the output.
func (i Install) TestRules(ctx context.Context, files ...string) (string, error) {
	return i.promtool(ctx, append([]string{"test", "rules"}, files...)...)
}

// CheckConfig runs promtool check config on a Prometheus configuration file (and the rule files
// it names) and returns its output; a rejected file is an error that holds the output.
func (i Install) CheckConfig(ctx context.Context, file string) (string, error) {
	return i.promtool(ctx, "check", "config", file)
}

// promtool runs promtool with args.
func (i Install) promtool(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, i.Promtool(), args...) //nolint:gosec // G204: the installation's own promtool
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("promtool %v: %w\n%s", args, err, out.String())
	}
	return out.String(), nil
}

package soak

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/test/harness/progress"
)

// soakElection is kube-scheduler's leader election in the soak: a Lease of 8 s, so that a
// killed leader's successor takes over within seconds.
var soakElection = cluster.LeaderElection{LeaseDuration: 8 * time.Second, RenewDeadline: 6 * time.Second, RetryPeriod: time.Second}

// defaultMinutes is the chaos time of the run inside make test; make soak sets SOAK_MINUTES.
const defaultMinutes = 2

// binDir holds the gpuslice binaries TestMain built from the working tree; empty when the test
// will skip. Written once, before any test runs.
var binDir string

// TestMain builds the gpuslice binaries from the product module into a temporary folder (seconds
// with a warm build cache), runs the tests and removes the folder.
func TestMain(m *testing.M) {
	os.Exit(cluster.RunWithGpuslice(m, filepath.Join("..", ".."), func(dir string) { binDir = dir })) // the product module, from test/soak
}

// soakOptions reads SOAK_MINUTES (chaos minutes, default 2) and SOAK_SEED (default: the time).
func soakOptions(t *testing.T) Options {
	t.Helper()
	opts := Options{Chaos: defaultMinutes * time.Minute, Seed: uint64(time.Now().UnixNano()), Logf: t.Logf, //nolint:gosec // G115: a seed
		Progress: progress.New(os.Stderr, "soak", progress.Options{})}
	if v := os.Getenv("SOAK_MINUTES"); v != "" {
		m, err := strconv.ParseFloat(v, 64)
		if err != nil || m <= 0 {
			t.Fatalf("SOAK_MINUTES=%q: want a number of minutes above 0, e.g. 20", v)
		}
		opts.Chaos = time.Duration(m * float64(time.Minute))
	}
	if v := os.Getenv("SOAK_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: want an unsigned integer", v)
		}
		opts.Seed = seed
	}
	return opts
}

// keepLogs copies every component's log into $SOAK_LOG_DIR, when set, before Stop removes the
// cluster's folder.
func keepLogs(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	dir := os.Getenv("SOAK_LOG_DIR")
	if dir == "" {
		return
	}
	for _, p := range c.State.Processes {
		b, err := os.ReadFile(p.Log)
		if err == nil {
			err = os.MkdirAll(dir, 0o750) //nolint:gosec // G703: the user names the folder
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, strings.ReplaceAll(p.Name, "/", "_")+".log"), b, 0o600) //nolint:gosec // G703: the user names the folder
		}
		if err != nil {
			t.Errorf("keep the log of %s: %v", p.Name, err)
		}
	}
	t.Logf("component logs kept in %s", dir)
}

// TestSoak runs the chaos soak (see the package comment) for SOAK_MINUTES and fails on any
// violation. It skips where a cluster cannot run, and fails there when CI=true.
func TestSoak(t *testing.T) {
	if err := cluster.HostSupport(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("soak: %v (CI=true: not skipping)", err)
		}
		t.Skipf("soak: %v", err)
	}
	opts := soakOptions(t)
	t.Logf("soak: %v of chaos, seed %d (SOAK_SEED=%d repeats the choices)", opts.Chaos, opts.Seed, opts.Seed)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{
		Nodes:          Nodes(),
		PluginPath:     filepath.Join(binDir, "gpuslice-device-plugin"),
		ExtenderPath:   filepath.Join(binDir, cluster.ExtenderName),
		WebhookPath:    filepath.Join(binDir, cluster.WebhookName),
		StopWithParent: true,
		// Two scheduler pairs, as the chart runs, for the leader hand-over fault, and the API
		// proxy in front of the extenders for the write-latency fault.
		Schedulers:     2,
		LeaderElection: soakElection,
		APIProxy:       true,
	})
	if err != nil {
		t.Fatalf("soak: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("component logs:\n%s", c.LogTails(40))
			keepLogs(t, c)
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
	})

	report, err := Run(context.Background(), c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + report.String())
	if len(report.Violations) > 0 {
		t.Errorf("%d violations (goal: zero); seed %d", len(report.Violations), opts.Seed)
	}
}

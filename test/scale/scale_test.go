package scale_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/test/harness/progress"
	"github.com/gpuslice/gpuslice/test/scale"
	"github.com/gpuslice/gpuslice/vgpu/simulate"
)

// Paths from this package's folder.
var (
	repoRoot = filepath.Join("..", "..")
	chartDir = filepath.Join(repoRoot, "charts", "gpuslice")
	// traceDir is the FGD trace beside the repository; testdataNodes the product module's small
	// node list, used when the trace is absent.
	traceDir      = filepath.Join(repoRoot, "..", "shared", "data", "fgd-trace")
	testdataNodes = filepath.Join(repoRoot, "vgpu", "simulate", "testdata", "nodes.csv")
)

// binaries are the extender and webhook TestMain built from this tree; empty when the cluster
// binaries are missing and the tests skip.
var binaries struct{ dir, extender, webhook, why string }

// TestMain builds the extender and the webhook from the working tree (seconds with a warm build
// cache) when the cluster binaries exist, runs the tests and removes them.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	binDir, err := cluster.FindBinDir()
	if err == nil {
		_, err = os.Stat(filepath.Join(binDir, "helm"))
	}
	if err != nil {
		binaries.why = err.Error()
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "gs-scale-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "scale: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if binaries.extender, binaries.webhook, err = scale.Build(ctx, repoRoot, dir); err != nil {
		fmt.Fprintf(os.Stderr, "scale: %v\n", err)
		return 1
	}
	binaries.dir = dir
	return m.Run()
}

// requireCluster skips t when the cluster binaries are not built; with CI=true it fails instead.
func requireCluster(t *testing.T) {
	t.Helper()
	if binaries.dir != "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("scale: %s (CI=true: not skipping)", binaries.why)
	}
	t.Skipf("scale: %s (run make cluster)", binaries.why)
}

// nodeRows reads the FGD trace's GPU node list, or the product module's small node list when
// the trace is not beside the repository.
func nodeRows(t *testing.T) []simulate.Node {
	t.Helper()
	path := filepath.Join(traceDir, "openb_node_list_gpu_node.csv")
	if _, err := os.Stat(path); err != nil {
		path = testdataNodes
	}
	rows := readTrace(t, path, simulate.ReadNodes)
	t.Logf("GPU models from %s", filepath.Base(path))
	return rows
}

// readTrace parses the trace file at path with parse, failing t when it cannot.
func readTrace[T any](t *testing.T, path string, parse func(io.Reader) (T, error)) T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("read the FGD trace (it must be beside the repository): %v", err)
	}
	defer f.Close()
	v, err := parse(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// harnessConfig is the harness configuration for nodes, running this tree's binaries.
func harnessConfig(t *testing.T, nodes []scale.NodeSpec) scale.Config {
	return scale.Config{
		Nodes:        nodes,
		ChartDir:     chartDir,
		ExtenderPath: binaries.extender,
		WebhookPath:  binaries.webhook,
		Logf:         t.Logf,
	}
}

// withEnvChart returns hc with the benchmarks' chart settings from the environment:
// SCALE_PROFILE_PATCH as Config.ProfilePatch and SCALE_CHART_SET (comma-separated helm --set
// values) added to Config.ChartSet.
func withEnvChart(hc scale.Config) scale.Config {
	hc.ProfilePatch = os.Getenv("SCALE_PROFILE_PATCH")
	if set := os.Getenv("SCALE_CHART_SET"); set != "" {
		hc.ChartSet = append(hc.ChartSet, strings.Split(set, ",")...)
	}
	return hc
}

// TestSmall runs the harness's smallest configuration, 100 hollow 8-GPU nodes and 300 pods per
// phase, so that it cannot rot: it prints the figures and fails only on a wrong allocation or a
// GPU pod that could not be bound at all.
func TestSmall(t *testing.T) {
	requireCluster(t)
	nodes, err := scale.FixedNodes(nodeRows(t), "hollow", 100, 8, scale.DefaultSplitCount)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := scale.Bench(ctx, scale.BenchConfig{Harness: harnessConfig(t, nodes), Pods: 300, Seed: 1, PhaseTimeout: 40 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	scale.WriteResult(&b, res)
	t.Log(b.String())
	if err := res.Check.Err(); err != nil {
		t.Errorf("the extender's allocations are wrong:\n%v", err)
	}
	if res.GPU.Bound == 0 {
		t.Errorf("no GPU pod was bound in %v", res.GPU.Elapsed)
	}
	// Targeted retries: a change on a node the waiters were not turned away by wakes none.
	for _, w := range []*scale.WakeResult{res.Wake, res.WakeHeartbeat} {
		if w != nil && (w.ElsewhereRetries != 0 || w.ElsewherePatches != 0) {
			t.Errorf("a change on another node woke the waiters: %+v", *w)
		}
	}
}

// TestBenchScale is make bench-scale: it runs only when SCALE_NODES lists node counts
// (e.g. "100,1000,5000"), one cluster per count, N = scale.PodsFor(count) pods per phase
// unless SCALE_PODS sets N, SCALE_BACKGROUND_PODS plain pods created bound first
// (BenchConfig.Background), each phase bounded by SCALE_PHASE_TIMEOUT (default 5m), the chart's
// profile patched with SCALE_PROFILE_PATCH when set (Config.ProfilePatch). It prints
// each cluster's detail and a summary; only a wrong allocation fails it.
func TestBenchScale(t *testing.T) {
	list := os.Getenv("SCALE_NODES")
	if list == "" {
		t.Skip("set SCALE_NODES (e.g. 100,1000,5000) to run the scale benchmark: make bench-scale")
	}
	requireCluster(t)
	var counts []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			t.Fatalf("SCALE_NODES=%q: want a comma-separated list of node counts above 0", list)
		}
		counts = append(counts, n)
	}
	pods := 0
	if s := os.Getenv("SCALE_PODS"); s != "" {
		var err error
		if pods, err = strconv.Atoi(s); err != nil || pods < 1 {
			t.Fatalf("SCALE_PODS=%q: want a number of pods above 0", s)
		}
	}
	timeout := scale.DefaultPhaseTimeout
	if s := os.Getenv("SCALE_PHASE_TIMEOUT"); s != "" {
		var err error
		if timeout, err = time.ParseDuration(s); err != nil || timeout <= 0 {
			t.Fatalf("SCALE_PHASE_TIMEOUT=%q: want a duration such as 5m", s)
		}
	}
	background := 0
	if s := os.Getenv("SCALE_BACKGROUND_PODS"); s != "" {
		var err error
		if background, err = strconv.Atoi(s); err != nil || background < 0 {
			t.Fatalf("SCALE_BACKGROUND_PODS=%q: want a number of pods, 0 or more", s)
		}
	}
	rows := nodeRows(t)
	var results []scale.BenchResult
	// Each phase's pods bound, elapsed and left: one updating line on a terminal (make
	// bench-scale streams the test's output), plain lines otherwise.
	pr := progress.New(os.Stdout, "bench-scale", progress.Options{})
	for _, count := range counts {
		nodes, err := scale.FixedNodes(rows, "hollow", count, 8, scale.DefaultSplitCount)
		if err != nil {
			t.Fatal(err)
		}
		n := pods
		if n == 0 {
			n = scale.PodsFor(count)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*timeout+10*time.Minute)
		hc := harnessConfig(t, nodes)
		hc = withEnvChart(hc)
		hc.Progress, hc.Logf = pr, pr.Printf
		res, err := scale.Bench(ctx, scale.BenchConfig{Harness: hc, Pods: n, Seed: 1, PhaseTimeout: timeout, Background: background})
		cancel()
		if err != nil {
			t.Fatalf("%d nodes: %v", count, err)
		}
		scale.WriteResult(os.Stdout, res)
		if err := res.Check.Err(); err != nil {
			t.Errorf("%d nodes: the extender's allocations are wrong:\n%v", count, err)
		}
		results = append(results, res)
	}
	scale.WriteSummary(os.Stdout, results)
}

// TestReplayFGD is make bench-fgd: it runs only when FGD_SEED is set, and replays the FGD trace
// (beside the repository) through kube-scheduler and the extender with policy FGD_POLICY
// (default fragmentation), FGD_CPU_TASKS (gpuslice, the default, or default-scheduler: where the
// tasks without GPUs go), SCALE_PROFILE_PATCH and SCALE_CHART_SET as in TestBenchScale, printing the real path's
// unallocated-GPU share beside
// vgpu/simulate's for the same seed. Only a wrong allocation fails it.
func TestReplayFGD(t *testing.T) {
	seedText := os.Getenv("FGD_SEED")
	if seedText == "" {
		t.Skip("set FGD_SEED (e.g. 42) to replay the FGD trace through the scheduler: make bench-fgd")
	}
	requireCluster(t)
	seed, err := strconv.ParseUint(seedText, 10, 64)
	if err != nil {
		t.Fatalf("FGD_SEED=%q: want a non-negative integer", seedText)
	}
	policy := simulate.Policy(os.Getenv("FGD_POLICY"))
	if policy == "" {
		policy = simulate.PolicyFragmentation
	}
	rows := readTrace(t, filepath.Join(traceDir, "openb_node_list_gpu_node.csv"), simulate.ReadNodes)
	tasks := readTrace(t, filepath.Join(traceDir, "openb_pod_list_default.csv"), simulate.ReadTasks)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	hc := harnessConfig(t, nil)
	hc = withEnvChart(hc)
	res, err := scale.Replay(ctx, scale.ReplayConfig{Harness: hc, Rows: rows, Tasks: tasks, Policy: policy, Seed: seed, CPUTasks: os.Getenv("FGD_CPU_TASKS")})
	if err != nil {
		t.Fatal(err)
	}
	scale.WriteReplay(os.Stdout, res)
	if err := res.Check.Err(); err != nil {
		t.Errorf("the extender's allocations are wrong:\n%v", err)
	}
}

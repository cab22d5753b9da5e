package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/gpuslice/gpuslice/vgpu/simulate"
)

// simulateConfig is the simulate subcommand's flags.
type simulateConfig struct {
	trace, nodes, expected string
	// variant, when set, is made from the trace (simulate.MakeVariant).
	variant   *simulate.VariantSpec
	policies  []simulate.Policy
	seeds     int
	firstSeed uint64
	parallel  int
	tune      float64
	failed    int
	// order is the device order of DRA-mode nodes.
	order simulate.DeviceOrder
}

func parseSimulateFlags(args []string, out io.Writer) (simulateConfig, error) {
	var cfg simulateConfig
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.trace, "trace", "", "pod list CSV (openb_pod_list_*.csv); required")
	fs.StringVar(&cfg.nodes, "nodes", "", "node list CSV (openb_node_list_*.csv); required")
	fs.StringVar(&cfg.expected, "expected", "", "the simulator's analysis_allo_discrete.csv to compare per seed; default: simulator-expected-results/ beside the trace, when present")
	policy := fs.String("policy", "all", "all, or a comma-separated list of "+policyNames())
	fs.IntVar(&cfg.seeds, "seeds", 10, "number of seeds, from --first-seed on")
	fs.Uint64Var(&cfg.firstSeed, "first-seed", 42, "first seed (the paper uses 42 to 51)")
	fs.IntVar(&cfg.parallel, "parallel", runtime.GOMAXPROCS(0), "replays run at once")
	fs.Float64Var(&cfg.tune, "tune", simulate.DefaultTune, "demand, as a multiple of capacity, the task list is extended to")
	fs.IntVar(&cfg.failed, "failed", 0, "also list, per policy, the N shapes of failed tasks with the most GPU demand (mean per seed)")
	order := fs.String("device-order", string(simulate.DeviceOrderIndex), "device order of DRA-mode nodes' ResourceSlices, which the DRA allocator's first fit follows (policies dra, dra-gpuslice): index, or used (most used first, republished after every allocation)")
	variant := fs.String("variant", "", "replay a variant made from the trace, as the FGD paper's simulator made its files: gpuspecNN, multigpuNN or cpuNNN (e.g. gpuspec33, multigpu50, cpu250); default: the trace itself")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	var errs []error
	if *variant != "" {
		v, err := simulate.ParseVariant(*variant)
		if err != nil {
			errs = append(errs, fmt.Errorf("--variant: %w", err))
		}
		cfg.variant = &v
	}
	if cfg.trace == "" {
		errs = append(errs, errors.New("--trace: required"))
	}
	if cfg.nodes == "" {
		errs = append(errs, errors.New("--nodes: required"))
	}
	if cfg.seeds < 1 {
		errs = append(errs, fmt.Errorf("--seeds=%d: must be at least 1", cfg.seeds))
	}
	cfg.parallel = max(cfg.parallel, 1)
	if o, err := simulate.ParseDeviceOrder(*order); err != nil {
		errs = append(errs, fmt.Errorf("--device-order: %w", err))
	} else {
		cfg.order = o
	}
	known := append(simulate.Policies(), simulate.DRAPolicies()...)
	if *policy == "all" {
		cfg.policies = known
	}
	for name := range strings.SplitSeq(*policy, ",") {
		if *policy == "all" {
			break
		}
		i := slices.Index(known, simulate.Policy(name))
		if i < 0 {
			errs = append(errs, fmt.Errorf("--policy=%q: must be all or a comma-separated list of %s", *policy, policyNames()))
			break
		}
		cfg.policies = append(cfg.policies, known[i])
	}
	if cfg.expected == "" && cfg.trace != "" {
		guess := filepath.Join(filepath.Dir(cfg.trace), "simulator-expected-results", "analysis_allo_discrete.csv")
		if _, err := os.Stat(guess); err == nil {
			cfg.expected = guess
		}
	}
	return cfg, errors.Join(errs...)
}

func policyNames() string {
	var names []string
	for _, p := range append(simulate.Policies(), simulate.DRAPolicies()...) {
		names = append(names, string(p))
	}
	return strings.Join(names, ", ")
}

// runSimulate runs the replays and writes the report.
func runSimulate(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := parseSimulateFlags(args, out)
	if err != nil {
		return err
	}
	nodes, err := readFile(cfg.nodes, simulate.ReadNodes)
	if err != nil {
		return err
	}
	tasks, err := readFile(cfg.trace, simulate.ReadTasks)
	if err != nil {
		return err
	}
	workload := strings.TrimSuffix(filepath.Base(cfg.trace), filepath.Ext(cfg.trace))
	traceName := filepath.Base(cfg.trace)
	if cfg.variant != nil {
		if tasks, err = simulate.MakeVariant(tasks, *cfg.variant); err != nil {
			return err
		}
		// The paper's files are named openb_pod_list_<variant>.
		workload = "openb_pod_list_" + cfg.variant.Name
		traceName += " as " + cfg.variant.Name
	}
	var published []simulate.Published
	if cfg.expected != "" {
		published, err = readFile(cfg.expected, func(r io.Reader) ([]simulate.Published, error) {
			return simulate.ReadPublished(r, workload)
		})
		if err != nil {
			return err
		}
	}

	type job struct {
		policy simulate.Policy
		seed   uint64
	}
	type outcome struct {
		res     simulate.Result
		elapsed time.Duration
		err     error
	}
	var jobs []job
	for _, p := range cfg.policies {
		for s := range cfg.seeds {
			jobs = append(jobs, job{p, cfg.firstSeed + uint64(s)})
		}
	}
	results := make([]outcome, len(jobs))
	sem := make(chan struct{}, cfg.parallel)
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if ctx.Err() != nil {
				results[i].err = ctx.Err()
				return
			}
			start := time.Now()
			res, err := simulate.Replay(nodes, tasks, simulate.Config{Policy: j.policy, Seed: j.seed, Tune: cfg.tune, DeviceOrder: cfg.order})
			results[i] = outcome{res: res, elapsed: time.Since(start), err: err}
		})
	}
	wg.Wait()
	for _, r := range results {
		if r.err != nil {
			return r.err
		}
	}

	gpus := 0
	for _, n := range nodes {
		gpus += n.GPUs
	}
	fmt.Fprintf(out, "trace %s: %d tasks; nodes %s: %d nodes, %d GPUs; seeds %d..%d; tune %.2f\n\n",
		traceName, len(tasks), filepath.Base(cfg.nodes), len(nodes), gpus,
		cfg.firstSeed, cfg.firstSeed+uint64(cfg.seeds)-1, cfg.tune) //nolint:gosec // G115: seeds >= 1, checked in parse.
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tunallocated GPU (mean)\tmin\tmax\tfailed tasks (mean)\ttime per replay (mean)\t")
	for pi, p := range cfg.policies {
		var sum, lo, hi, failed float64
		var elapsed time.Duration
		lo = math.Inf(1)
		for s := range cfg.seeds {
			r := results[pi*cfg.seeds+s]
			u := r.res.UnallocatedPercent
			sum += u
			lo, hi = min(lo, u), max(hi, u)
			failed += float64(r.res.Failed)
			elapsed += r.elapsed
		}
		n := float64(cfg.seeds)
		fmt.Fprintf(tw, "%s\t%.2f%%\t%.2f%%\t%.2f%%\t%.0f\t%s\t\n", p, sum/n, lo, hi, failed/n,
			(elapsed / time.Duration(cfg.seeds)).Round(time.Millisecond))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	plain := make([]simulate.Result, len(results))
	for i, r := range results {
		plain[i] = r.res
	}
	if cfg.failed > 0 {
		if err := writeFailures(out, cfg, plain); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "\npublished (Weng et al., ATC '23, openb_pod_list_default, mean of 10 seeds):")
	for _, p := range simulate.PaperResults() {
		fmt.Fprintf(out, "  %-14s %6.2f%%\n", p.Policy, p.UnallocatedPercent)
	}
	if means := simulate.PublishedMeans(published); len(means) > 0 && workload != "openb_pod_list_default" {
		fmt.Fprintf(out, "\npublished for %s (%s, mean over its seeds; the paper's file, not this run's variant):\n", workload, filepath.Base(cfg.expected))
		for _, m := range means {
			fmt.Fprintf(out, "  %-16s %6.2f%%\n", m.Policy, m.UnallocatedPercent)
		}
	}
	if len(published) > 0 {
		fmt.Fprintf(out, "\nper seed, %s (the simulator's seeds shuffle differently: compare spreads, not rows):\n", filepath.Base(cfg.expected))
		writePerSeed(out, cfg, plain, published)
	}
	return nil
}

// writeFailures lists, per policy, the cfg.failed shapes of failed tasks
// with the most GPU demand, as means per seed over the policy's replays
// (results in job order: policy by policy, seed by seed).
func writeFailures(out io.Writer, cfg simulateConfig, results []simulate.Result) error {
	for pi, p := range cfg.policies {
		type key struct {
			gpus   int
			milli  int64
			models string
		}
		sums := map[key]*simulate.Failure{}
		for s := range cfg.seeds {
			for _, f := range results[pi*cfg.seeds+s].Failures {
				k := key{f.GPUs, f.GPUMilli, f.Models}
				if sums[k] == nil {
					sums[k] = &simulate.Failure{GPUs: f.GPUs, GPUMilli: f.GPUMilli, Models: f.Models}
				}
				sums[k].Tasks += f.Tasks
				sums[k].DemandMilli += f.DemandMilli
			}
		}
		all := make([]simulate.Failure, 0, len(sums))
		for _, f := range sums {
			all = append(all, *f)
		}
		slices.SortFunc(all, func(a, b simulate.Failure) int {
			return cmp.Or(cmp.Compare(b.DemandMilli, a.DemandMilli), cmp.Compare(a.GPUs, b.GPUs),
				cmp.Compare(a.GPUMilli, b.GPUMilli), cmp.Compare(a.Models, b.Models))
		})
		fmt.Fprintf(out, "\nfailed tasks of %s with the most GPU demand (mean per seed):\n", p)
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "GPUs\tshare (thousandths)\tmodels\ttasks\tGPU demand\t")
		n := float64(cfg.seeds)
		for _, f := range all[:min(cfg.failed, len(all))] {
			models := f.Models
			if models == "" {
				models = "any"
			}
			fmt.Fprintf(tw, "%d\t%d\t%s\t%.1f\t%.2f\t\n", f.GPUs, f.GPUMilli, models, float64(f.Tasks)/n, float64(f.DemandMilli)/1000/n)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func writePerSeed(out io.Writer, cfg simulateConfig, results []simulate.Result, published []simulate.Published) {
	var policies []string
	seen := map[string]bool{}
	bySeed := map[int]map[string]float64{}
	for _, p := range published {
		if !seen[p.Policy] {
			seen[p.Policy] = true
			policies = append(policies, p.Policy)
		}
		if bySeed[p.Seed] == nil {
			bySeed[p.Seed] = map[string]float64{}
		}
		bySeed[p.Seed][p.Policy] = p.UnallocatedPercent
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "seed\t")
	for _, p := range cfg.policies {
		fmt.Fprintf(tw, "%s\t", p)
	}
	for _, p := range policies {
		fmt.Fprintf(tw, "%s\t", p)
	}
	fmt.Fprintln(tw)
	for s := range cfg.seeds {
		seed := cfg.firstSeed + uint64(s)
		fmt.Fprintf(tw, "%d\t", seed)
		for pi := range cfg.policies {
			fmt.Fprintf(tw, "%.2f%%\t", results[pi*cfg.seeds+s].UnallocatedPercent)
		}
		for _, p := range policies {
			if v, ok := bySeed[int(seed)][p]; ok { //nolint:gosec // G115: seeds are small integers from the command line.
				fmt.Fprintf(tw, "%.2f%%\t", v)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
}

func readFile[T any](path string, parse func(io.Reader) (T, error)) (T, error) {
	f, err := os.Open(path) //nolint:gosec // G304: the user names the trace file.
	if err != nil {
		var zero T
		return zero, err
	}
	defer f.Close()
	v, err := parse(f)
	if err != nil {
		return v, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/test/harness/progress"
)

// Defaults of Options.
const (
	// DefaultNamespace holds the soak's pods.
	DefaultNamespace = "soak"
	// DefaultTargetPods is how many pods the driver keeps, above the nodes' slices so that
	// some always wait.
	DefaultTargetPods = 32
	// pendingGrace is how long a pod may be Pending before an event must say why.
	pendingGrace = time.Minute
	// settleTimeout bounds each wait once the chaos stops: pods that fit Running, pods gone,
	// the full set of slices Running.
	settleTimeout = 60 * time.Second
	// checkInterval is how often the invariants are checked during the chaos.
	checkInterval = 2 * time.Second
)

// Nodes returns the soak's nodes: three nodes of mixed GPU models, four slices per GPU, a short
// health cool-down so that GPUs come back within a chaos run.
func Nodes() []cluster.NodeOptions {
	args := []string{"--split-count=4", "--health-cooldown=2s"}
	return []cluster.NodeOptions{
		{Name: "node-a", FakeGPUs: "2xA100-80GB", PluginArgs: args},
		{Name: "node-b", FakeGPUs: "2xT4-16GB", PluginArgs: args},
		{Name: "node-c", FakeGPUs: "1xL4-24GB,1xA10-24GB", PluginArgs: args},
	}
}

// Options configure Run.
type Options struct {
	// Chaos is how long pods are driven and faults injected; the checks after it take a few
	// minutes more.
	Chaos time.Duration
	// Seed seeds the driver's and the chaos loop's choices.
	Seed uint64
	// Namespace holds the pods; empty means DefaultNamespace. It is created.
	Namespace string
	// TargetPods is how many pods the driver keeps; zero means DefaultTargetPods.
	TargetPods int
	// Logf prints progress; nil prints nothing.
	Logf func(format string, args ...any)
	// Progress, when set, shows the chaos's elapsed seconds against its
	// length and the running counts, then the settling phase.
	Progress *progress.Reporter
}

// soak is one run: the cluster, what the informers saw, and the tally.
type soak struct {
	c    *cluster.Cluster
	opts Options
	ns   string

	tally *tally
	seen  *seen
	// rc is how far the CreateContainer records were checked; only the check loop, then
	// settle, use it.
	rc *recordCheck
	// specUnusedSince is, by path, since when each CDI spec of the plugins has been found
	// unused (checkCDISpecs); only the check loop, then settle, use it.
	specUnusedSince map[string]time.Time
	// parts holds the restart lock of each component, shared by the chaos loop and the
	// supervisor.
	parts *parts
	// mu guards the chaos loop's record of the GPUs that wait for a reset, by node and index.
	mu         sync.Mutex
	needsReset map[string]map[int]bool
}

// Run runs the soak on c, whose nodes Nodes describes (or any nodes started with the faults
// folder), and returns its report; the error is for a soak that could not run (the namespace
// cannot be created, the informers never sync), not for violations, which the report holds.
func Run(ctx context.Context, c *cluster.Cluster, opts Options) (*Report, error) {
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.TargetPods == 0 {
		opts.TargetPods = DefaultTargetPods
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	s := &soak{c: c, opts: opts, ns: opts.Namespace, tally: newTally(), seen: newSeen(), rc: newRecordCheck(), parts: newParts(), needsReset: map[string]map[int]bool{}}
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", s.ns, err)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if err := s.watch(watchCtx); err != nil {
		return nil, err
	}

	began := time.Now()
	chaosCtx, stopChaos := context.WithTimeout(ctx, opts.Chaos)
	defer stopChaos()
	var wg sync.WaitGroup
	if p := opts.Progress; p != nil {
		p.Plan(2, 0)
		p.Stage("chaos", int(opts.Chaos/time.Second), "s")
		wg.Go(func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-chaosCtx.Done():
					return
				case <-tick.C:
					p.Set(int(time.Since(began)/time.Second), s.tally.brief())
				}
			}
		})
	}
	wg.Add(4)
	go func() { defer wg.Done(); s.superviseLoop(chaosCtx) }()
	go func() { defer wg.Done(); s.drive(chaosCtx, rand.New(rand.NewPCG(opts.Seed, 1))) }() //nolint:gosec // G404: reproducible test choices
	go func() { defer wg.Done(); s.chaos(chaosCtx, rand.New(rand.NewPCG(opts.Seed, 2))) }() //nolint:gosec // G404: reproducible test choices
	go func() { defer wg.Done(); s.checkLoop(chaosCtx) }()
	wg.Wait()
	opts.Logf("chaos over after %v: %s", time.Since(began).Round(time.Second), s.tally.brief())

	if opts.Progress != nil {
		opts.Progress.Stage("settle: every pod that fits Running, nothing held", 0, "")
	}
	s.settle(ctx)
	if opts.Progress != nil {
		opts.Progress.Finish("%s", s.tally.brief())
	}
	s.tally.elapsed = time.Since(began)
	if proxy, err := c.APIProxy(); err == nil {
		held := proxy.HeldWrites()
		s.tally.add(func(r *Report) { r.HeldWrites = held })
	}
	return s.tally.report(), nil
}

// watch starts the pod and event informers of the namespace and waits for them to sync. The
// informers outlive API server restarts: their reflectors list and watch again.
func (s *soak) watch(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(s.c.Client(), 0, informers.WithNamespace(s.ns))
	pods := factory.Core().V1().Pods().Informer()
	events := factory.Core().V1().Events().Informer()
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.seen.pod(obj) },
		UpdateFunc: func(_, obj any) { s.seen.pod(obj) },
		DeleteFunc: func(obj any) { s.seen.deleted(obj) },
	}); err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	if _, err := events.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.seen.event(obj) },
		UpdateFunc: func(_, obj any) { s.seen.event(obj) },
	}); err != nil {
		return fmt.Errorf("event informer: %w", err)
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer of %v did not sync", typ)
		}
	}
	return nil
}

// pause waits d or until ctx ends, and reports whether ctx is still live. It paces the driver
// and the chaos loop; nothing waits on it to synchronise.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// between returns a random duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

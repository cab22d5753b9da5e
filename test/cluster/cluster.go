package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/test/harness/findup"
	"github.com/gpuslice/gpuslice/test/monitoring"
)

// DefaultReadyTimeout bounds each readiness wait of Start when Options.ReadyTimeout is zero.
const DefaultReadyTimeout = 90 * time.Second

// pollInterval is how often readiness waits check their condition.
const pollInterval = 100 * time.Millisecond

// checkTimeout bounds one check of a waitFor condition.
const checkTimeout = 10 * time.Second

// Options configures Start. The zero value is a control plane with no nodes in a new folder.
type Options struct {
	// BinDir holds the binaries hack/build-cluster.sh builds; empty means FindBinDir.
	BinDir string
	// PluginPath, ExtenderPath and WebhookPath are the gpuslice-device-plugin,
	// gpuslice-scheduler and gpuslice-webhook binaries to run; empty means the ones in BinDir.
	PluginPath, ExtenderPath, WebhookPath string
	// DRAPluginPath is the gpuslice-dra-plugin binary DRA nodes run (NodeOptions.DRA); empty
	// means the one next to PluginPath.
	DRAPluginPath string
	// ControllerManager runs kube-controller-manager with the resourceclaim controller, which
	// turns ResourceClaimTemplates into the pods' ResourceClaims (DRA). Set it when a node has DRA.
	ControllerManager bool
	// ExtenderArgs and WebhookArgs are extra flags for the extender and the webhook.
	ExtenderArgs, WebhookArgs []string
	// DRAScore has the extender score DRA pods' nodes (its --dra) and kube-scheduler call it for
	// every pod, with prioritizeVerb dra/prioritize, as the chart does with dra.enabled; the
	// webhook steers the pods it turns into claims to the gpuslice profile (--dra-score, which
	// needs WebhookArgs --dra). Ignored with Chart and SchedulerConfig.
	DRAScore bool
	// SchedulerConfig, when set, is the KubeSchedulerConfiguration (YAML) kube-scheduler runs
	// with instead of the built-in stock and gpuslice profiles. Start sets its
	// clientConnection.kubeconfig and the urlPrefix of each of its extenders to the cluster's
	// own, and changes nothing else. Ignored with Chart.
	SchedulerConfig string
	// Schedulers, above 1, runs that many kube-scheduler and extender pairs (SchedulerPair), as
	// the chart's scheduler Deployment does with replicas: kube-scheduler runs leader election
	// (LeaderElection) and the extender follows its Lease. 0 or 1: one pair without leader
	// election. Ignored with Chart.
	Schedulers int
	// LeaderElection is kube-scheduler's leader-election timing with several Schedulers.
	LeaderElection LeaderElection
	// Audit has the API server log every request but reads (get, list, watch) at level Metadata
	// to AuditLogPath (AuditWrites reads it).
	Audit bool
	// APIProxy puts an APIProxy, run in this process, between every extender and the API server,
	// which can hold the extenders' writes (Cluster.APIProxy). Ignored with Chart.
	APIProxy bool
	// Chart, when set, installs gpuslice with helm and runs the components as the chart's
	// Deployments and DaemonSets say (see ChartOptions) instead of with the flags above.
	Chart *ChartOptions
	// Dir is the cluster's folder; it must not exist or be empty. Empty means a new folder under
	// the system temporary folder with a short name: unix socket paths under it must stay under
	// 108 bytes. Stop removes it.
	Dir string
	// Nodes are the simulated nodes to start, in order.
	Nodes []NodeOptions
	// Runtime, when set, runs every node on containerd and runc (real containers) instead of the
	// fake CRI; see RuntimeOptions.
	Runtime *RuntimeOptions
	// ReadyTimeout bounds each readiness wait; zero means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// Prometheus, when set, runs a Prometheus scraping the components as the chart's
	// ServiceMonitors say, once every node is up (PrometheusOptions, PrometheusURL).
	Prometheus *PrometheusOptions
	// StopWithParent has the kernel kill every component (SIGKILL) when the process that started
	// it dies, so that a test binary killed by its -timeout leaves nothing running (its folder
	// stays). Leave it false for a cluster that outlives its starter, as the demo's does.
	StopWithParent bool
}

// State is what a running cluster's state file (StatePath) records, so that another process can
// reach the cluster and stop it.
type State struct {
	// Dir is the cluster's folder; everything the cluster writes is under it.
	Dir string `json:"dir"`
	// BinDir is where the binaries were taken from; PluginPath, ExtenderPath and WebhookPath are
	// gpuslice's binaries.
	BinDir     string `json:"binDir"`
	PluginPath string `json:"pluginPath"`
	// DRAPluginPath is gpuslice's DRA driver binary.
	DRAPluginPath string `json:"draPluginPath,omitempty"`
	ExtenderPath  string `json:"extenderPath"`
	WebhookPath   string `json:"webhookPath"`
	// Kubeconfig is the admin kubeconfig's path.
	Kubeconfig string `json:"kubeconfig"`
	// Token is the admin bearer token; CAData the API server's PEM certificate. Tokens are the
	// bearer tokens of the scheduler pairs' users (SchedulerPair), by user.
	Token  string            `json:"token"`
	Tokens map[string]string `json:"tokens,omitempty"`
	CAData []byte            `json:"caData"`
	// EtcdPort and APIServerPort are the loopback ports of etcd's client URL and the API server.
	EtcdPort      int `json:"etcdPort"`
	APIServerPort int `json:"apiServerPort"`
	// Schedulers are the kube-scheduler and extender pairs, pair 0 first.
	Schedulers []SchedulerPair `json:"schedulers,omitempty"`
	// ExtenderPort is the (first pair's) extender's plain-HTTP loopback port; WebhookPort the webhook's HTTPS
	// port, whose self-signed serving certificate (also its CA) is WebhookCA.
	ExtenderPort int    `json:"extenderPort"`
	WebhookPort  int    `json:"webhookPort"`
	WebhookCA    []byte `json:"webhookCA"`
	// SchedulerPod and WebhookPod are the pods, in the chart's namespace, that run the chart's
	// scheduler Deployment (containers kube-scheduler and extender) and webhook Deployment on a
	// real runtime; empty when those run as host processes.
	SchedulerPod string `json:"schedulerPod,omitempty"`
	WebhookPod   string `json:"webhookPod,omitempty"`
	// PrometheusPort is the loopback port of the cluster's Prometheus (Options.Prometheus); 0
	// when none runs.
	PrometheusPort int `json:"prometheusPort,omitempty"`
	// Processes are the running components in start order; Stop stops them in reverse.
	Processes []*Process `json:"processes"`
	// Nodes are the simulated nodes' settings and folders.
	Nodes []NodeState `json:"nodes"`
	// Runtime is the real container runtime every node runs; nil means the fake CRI.
	Runtime *RuntimeOptions `json:"runtime,omitempty"`
}

// Cluster is a running local cluster. Its methods are safe for concurrent use, except that Stop
// must not run concurrently with a method that starts a process.
type Cluster struct {
	// Nodes are the simulated nodes, in the order of Options.Nodes.
	Nodes []*Node

	// State is what the state file holds. Starting a process (Start, AddNode, Node.Start*)
	// changes it under mu; read it when no start is in progress, or through LogTails.
	State State

	mu             sync.Mutex // guards State.Processes, State.Nodes and the state file
	readyTimeout   time.Duration
	stopWithParent bool
	client         kubernetes.Interface
	chart          *chartRelease     // nil unless started with Options.Chart
	prometheus     bool              // started with Options.Prometheus: plugins serve their metrics
	monitoring     *monitoring.Chart // what Prometheus runs with; nil without one
	proxy          *APIProxy         // nil unless started with Options.APIProxy
}

// Start starts etcd, kube-apiserver, the gpuslice extender and webhook, kube-scheduler (stock and
// gpuslice profiles) and every node of opts and waits for each to be ready: the API server's
// /readyz, the extender's /readyz, the API server calling the webhook, every Node Ready without
// the not-ready taint, and every node's device plugin registered (label hami.io/gpu.ready=true);
// with a chart on a real runtime, also every pod of the chart Ready by its probes; with
// Options.Prometheus, Prometheus ready and every target scraped once. ctx bounds the
// start; the processes outlive it and run until Stop. On error everything started is stopped
// again and the error carries the tail of every log.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	c := &Cluster{readyTimeout: opts.ReadyTimeout, stopWithParent: opts.StopWithParent}
	if c.readyTimeout == 0 {
		c.readyTimeout = DefaultReadyTimeout
	}
	var err error
	if c.State.BinDir = opts.BinDir; c.State.BinDir == "" {
		if c.State.BinDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	if c.State.PluginPath = opts.PluginPath; c.State.PluginPath == "" {
		c.State.PluginPath = filepath.Join(c.State.BinDir, "gpuslice-device-plugin")
	}
	if c.State.DRAPluginPath = opts.DRAPluginPath; c.State.DRAPluginPath == "" {
		c.State.DRAPluginPath = filepath.Join(filepath.Dir(c.State.PluginPath), DRAPluginName)
	}
	if c.State.ExtenderPath = opts.ExtenderPath; c.State.ExtenderPath == "" {
		c.State.ExtenderPath = filepath.Join(c.State.BinDir, ExtenderName)
	}
	if c.State.WebhookPath = opts.WebhookPath; c.State.WebhookPath == "" {
		c.State.WebhookPath = filepath.Join(c.State.BinDir, WebhookName)
	}
	if opts.Prometheus != nil {
		if opts.Chart != nil || opts.Runtime != nil {
			return nil, errors.New("prometheus: not with a chart or a real runtime (their components' ports are the chart's)")
		}
		c.prometheus = true
	}
	if opts.Runtime != nil {
		rt := *opts.Runtime
		if rt.Dir == "" {
			if rt.Dir, err = FindRuntimeDir(); err != nil {
				return nil, err
			}
		} else if err := checkRuntimeDir(rt.Dir); err != nil {
			return nil, err
		}
		if len(rt.Images) == 0 {
			return nil, errors.New("runtime: no images: nothing is pulled, so at least the pause image's archive is needed (make image)")
		}
		c.State.Runtime = &rt
	}
	if c.State.Dir = opts.Dir; c.State.Dir == "" {
		if c.State.Dir, err = os.MkdirTemp("", "gs-"); err != nil {
			return nil, fmt.Errorf("create cluster folder: %w", err)
		}
	} else if entries, err := os.ReadDir(c.State.Dir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("cluster folder %s is not empty: another cluster's, or one a crash left behind (its Down removes it)", c.State.Dir)
	} else if err := os.MkdirAll(c.State.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("create cluster folder: %w", err)
	}
	if err := c.saveState(); err != nil {
		return nil, err
	}
	if err := c.startAll(ctx, opts); err != nil {
		logs := c.LogTails(30)
		if stopErr := c.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		return nil, fmt.Errorf("start cluster: %w\n%s", err, logs)
	}
	return c, nil
}

// startAll starts the control plane, then the nodes one after another.
func (c *Cluster) startAll(ctx context.Context, opts Options) error {
	if err := c.startEtcd(ctx); err != nil {
		return err
	}
	if err := c.startAPIServer(ctx, schedulerUsers(opts.Schedulers), opts.Audit); err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	c.client = client
	if opts.Chart != nil {
		if err := c.installChart(ctx, *opts.Chart); err != nil {
			return err
		}
		if c.State.Runtime != nil {
			// The scheduler and webhook pods need a node's containerd: the nodes (and their
			// device-plugin pods, which need neither) come first.
			if err := c.addNodes(ctx, opts.Nodes); err != nil {
				return err
			}
			return c.startChartControlPlanePods(ctx)
		}
		if err := c.startChartControlPlane(ctx); err != nil {
			return err
		}
		return c.addNodes(ctx, opts.Nodes)
	}
	extenderArgs, webhookArgs := opts.ExtenderArgs, opts.WebhookArgs
	if opts.DRAScore {
		extenderArgs = append(slices.Clone(extenderArgs), "--dra")
		webhookArgs = append(slices.Clone(webhookArgs), "--dra-score")
	}
	if opts.APIProxy {
		if c.proxy, err = startAPIProxy(c.RESTConfig()); err != nil {
			return err
		}
	}
	if err := c.startWebhook(ctx, webhookArgs); err != nil {
		return err
	}
	if err := c.startSchedulers(ctx, opts, extenderArgs); err != nil {
		return err
	}
	if opts.ControllerManager {
		if err := c.startControllerManager(ctx); err != nil {
			return err
		}
	}
	if err := c.addNodes(ctx, opts.Nodes); err != nil {
		return err
	}
	if opts.Prometheus != nil {
		return c.startPrometheus(ctx, *opts.Prometheus)
	}
	return nil
}

// addNodes adds nodes one after another.
func (c *Cluster) addNodes(ctx context.Context, nodes []NodeOptions) error {
	for _, no := range nodes {
		if _, err := c.AddNode(ctx, no); err != nil {
			return err
		}
	}
	return nil
}

// Client returns the admin clientset.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// StatePath returns the state file's path: state.json in the cluster's folder.
func (c *Cluster) StatePath() string { return filepath.Join(c.State.Dir, "state.json") }

// start starts BinDir/bin (or, when bin is absolute, bin itself) as the component name, with a new
// working folder and a log file under dir, and records it in the state file.
func (c *Cluster) start(name, bin string, args []string, dir string) (*Process, error) {
	return c.startEnv(name, bin, args, nil, dir)
}

// startEnv is start with env set on top of this process's environment.
func (c *Cluster) startEnv(name, bin string, args, env []string, dir string) (*Process, error) {
	path := bin
	if !filepath.IsAbs(bin) {
		path = filepath.Join(c.State.BinDir, bin)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("%s: %w (run hack/build-cluster.sh)", name, err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("%s: create folder: %w", name, err)
	}
	base := filepath.Base(name)
	workDir, err := os.MkdirTemp(dir, base+"-cwd-")
	if err != nil {
		return nil, fmt.Errorf("%s: create working folder: %w", name, err)
	}
	p, err := startProcess(name, path, args, env, workDir, filepath.Join(dir, base+".log"), c.stopWithParent)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	replaced := false
	for i, old := range c.State.Processes {
		if old.Name == name {
			c.State.Processes[i], replaced = p, true
		}
	}
	if !replaced {
		c.State.Processes = append(c.State.Processes, p)
	}
	return p, c.saveStateLocked()
}

// waitFor polls cond until it returns true, an error, one of procs exits, or the ready timeout
// (or ctx) ends. The error names what was awaited.
func (c *Cluster) waitFor(ctx context.Context, what string, procs []*Process, cond func(ctx context.Context) (bool, error)) error {
	began := time.Now()
	err := wait.PollUntilContextTimeout(ctx, pollInterval, c.readyTimeout, true, func(ctx context.Context) (bool, error) {
		for _, p := range procs {
			if p != nil && p.Exited() {
				return false, fmt.Errorf("%s exited (log %s)", p.Name, p.Log)
			}
		}
		// One check that hangs (a request a starting server accepted but never
		// answered) must not use up the whole wait: each gets its own deadline.
		ctx, cancel := context.WithTimeout(ctx, checkTimeout)
		defer cancel()
		return cond(ctx)
	})
	if err != nil {
		return fmt.Errorf("wait for %s (%v): %w", what, time.Since(began).Round(time.Millisecond), err)
	}
	return nil
}

// LogTails returns the last n lines of every component's log, each under a header.
func (c *Cluster) LogTails(n int) string {
	c.mu.Lock()
	procs := append([]*Process(nil), c.State.Processes...)
	c.mu.Unlock()
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "----- %s (pid %d, %s) -----\n%s\n", p.Name, p.PID, p.Log, p.LogTail(n))
	}
	if c.State.Runtime != nil {
		b.WriteString(c.containerLogTails(n))
	}
	return b.String()
}

// Stop stops every process in reverse start order (SIGTERM, then SIGKILL) and removes the
// cluster's folder. It is idempotent.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	st := c.State
	c.mu.Unlock()
	err := stopState(st)
	if c.proxy != nil {
		c.proxy.Close()
	}
	return err
}

// stopState stops st's processes in reverse order and removes st.Dir.
func stopState(st State) error {
	var errs []error
	for i := len(st.Processes) - 1; i >= 0; i-- {
		if err := st.Processes[i].Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range st.Nodes {
		if isRuntimeNode(n.Dir) {
			if err := cleanupContainers(n.Dir); err != nil {
				errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("stop cluster (folder %s kept): %w", st.Dir, errors.Join(errs...))
	}
	if st.Dir != "" {
		if err := os.RemoveAll(st.Dir); err != nil {
			return fmt.Errorf("remove cluster folder: %w", err)
		}
	}
	return nil
}

// FindBinDir returns $GPUSLICE_CLUSTER_BIN when set, else the first _output/cluster/bin found in the
// working directory or one of its parents.
func FindBinDir() (string, error) {
	if d := os.Getenv("GPUSLICE_CLUSTER_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "kubelet")); err != nil { //nolint:gosec // G703: the user names the folder
			return "", fmt.Errorf("GPUSLICE_CLUSTER_BIN=%s: %w (run hack/build-cluster.sh)", d, err)
		}
		return d, nil
	}
	dir, ok, err := findup.Dir(filepath.Join("_output", "cluster", "bin"), findup.Has("kubelet"))
	if err != nil || ok {
		return dir, err
	}
	return "", errors.New("cluster binaries not found in _output/cluster/bin of the working directory or a parent: run hack/build-cluster.sh (or set GPUSLICE_CLUSTER_BIN)")
}

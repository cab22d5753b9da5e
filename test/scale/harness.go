package scale

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/test/harness/progress"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Defaults of Config.
const (
	// DefaultNamespace is where the harness creates its pods.
	DefaultNamespace = "scale"
	// DefaultWorkers is how many API requests the harness keeps in flight when it creates
	// nodes and pods.
	DefaultWorkers = 32
)

// Config is one harness cluster.
type Config struct {
	// Nodes are the hollow nodes to create; required.
	Nodes []NodeSpec
	// ChartDir is the gpuslice chart whose scheduler profile and extender configuration are
	// run; required. ChartSet are extra helm --set values ("key=value").
	ChartDir string
	ChartSet []string
	// BinDir holds the cluster binaries (hack/build-cluster.sh); empty means
	// cluster.FindBinDir. Its helm renders the chart.
	BinDir string
	// ExtenderPath and WebhookPath are the gpuslice-scheduler and gpuslice-webhook binaries;
	// empty means BinDir's (see Build to test the tree being worked on).
	ExtenderPath, WebhookPath string
	// ExtenderArgs are extra extender flags, after the chart's configuration file.
	ExtenderArgs []string
	// ProfilePatch, when set, is a JSON merge patch applied to the chart's scheduler profile,
	// for settings the chart has no value for; empty runs the chart's profile as rendered.
	ProfilePatch string
	// HeartbeatInterval is how often each heartbeat Lease is renewed; 0 means the device
	// plugin's default leaseRenew.
	HeartbeatInterval time.Duration
	// Namespace is where pods are created; empty means DefaultNamespace.
	Namespace string
	// Workers bounds the requests in flight while creating nodes and pods; 0 means
	// DefaultWorkers.
	Workers int
	// Logf, when set, receives progress lines (no newline at the end).
	Logf func(format string, args ...any)
	// Progress, when set, shows each phase's pods bound as they bind (one updating line on a
	// terminal) instead of a Logf line every 10 s.
	Progress *progress.Reporter
}

// Harness is a running cluster of real components and hollow nodes. Its methods must not be
// called concurrently.
type Harness struct {
	// Cluster is the control plane.
	Cluster *cluster.Cluster
	// Profile is the chart's scheduler configuration the cluster runs.
	Profile ChartProfile

	cfg        Config
	client     kubernetes.Interface
	nodes      map[string]NodeSpec
	heartbeats *heartbeats
	watch      *podWatch
	configDir  string // the chart's extender configuration
	stop       context.CancelFunc
	done       chan struct{}
}

// Start renders the chart's scheduler profile, starts the cluster (etcd, kube-apiserver, the
// extender with the chart's extender configuration, the webhook, and kube-scheduler with the
// chart's profile beside the default one), creates the hollow nodes and their heartbeat Leases,
// starts renewing the Leases and watching pods, and waits until the extender's informers have
// seen every node. ctx bounds the start only; Stop ends everything.
func Start(ctx context.Context, cfg Config) (h *Harness, err error) {
	if len(cfg.Nodes) == 0 || cfg.ChartDir == "" {
		return nil, errors.New("scale config: Nodes and ChartDir are required")
	}
	if cfg.BinDir == "" {
		if cfg.BinDir, err = cluster.FindBinDir(); err != nil {
			return nil, err
		}
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = deviceplugin.DefaultLeaseRenew
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	h = &Harness{cfg: cfg, nodes: nodeIndex(cfg.Nodes), done: make(chan struct{})}
	if h.Profile, err = RenderChart(ctx, filepath.Join(cfg.BinDir, "helm"), cfg.ChartDir, cfg.ChartSet...); err != nil {
		return nil, err
	}
	schedulerConfig, err := withDefaultProfile(h.Profile.SchedulerConfig, cfg.ProfilePatch)
	if err != nil {
		return nil, err
	}
	extenderDoc, err := withoutLeaderLease(h.Profile.ExtenderConfig)
	if err != nil {
		return nil, err
	}
	if h.configDir, err = os.MkdirTemp("", "gs-scale-"); err != nil {
		return nil, fmt.Errorf("harness folder: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, h.Stop())
		}
	}()
	extenderConfig := filepath.Join(h.configDir, "extender.yaml")
	if err := os.WriteFile(extenderConfig, []byte(extenderDoc), 0o600); err != nil {
		return nil, fmt.Errorf("write the chart's extender configuration: %w", err)
	}
	began := time.Now()
	h.Cluster, err = cluster.Start(ctx, cluster.Options{
		BinDir:       cfg.BinDir,
		ExtenderPath: cfg.ExtenderPath,
		WebhookPath:  cfg.WebhookPath,
		// The chart's file, then: the cluster's --address stays (flags win over the file), and
		// /healthz, /readyz and /metrics are served on that loopback address instead of the
		// chart's fixed health port on every interface.
		ExtenderArgs:    append([]string{"--config=" + extenderConfig, "--health-address="}, cfg.ExtenderArgs...),
		SchedulerConfig: schedulerConfig,
		StopWithParent:  true,
	})
	if err != nil {
		return nil, err
	}
	cfg.Logf("control plane up in %v", time.Since(began).Round(time.Millisecond))

	// The harness's own client: protobuf, and no client-side rate limit worth the name, so
	// that creating 5,000 nodes takes seconds.
	rc := h.Cluster.RESTConfig()
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.QPS, rc.Burst = 5000, 10000
	if h.client, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, fmt.Errorf("harness client: %w", err)
	}
	if _, err := h.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cfg.Namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", cfg.Namespace, err)
	}
	began = time.Now()
	leases, err := createNodes(ctx, h.client, cfg.Nodes, vgpu.DefaultHeartbeatNamespace, cfg.Workers)
	if err != nil {
		return nil, err
	}
	cfg.Logf("%d hollow nodes (%d GPUs) and their heartbeat Leases created in %v", len(cfg.Nodes), gpuCount(cfg.Nodes), time.Since(began).Round(time.Millisecond))

	runCtx, stop := context.WithCancel(context.Background())
	h.stop = stop
	h.heartbeats = &heartbeats{client: h.client, interval: cfg.HeartbeatInterval, workers: 8, leases: leases}
	if h.watch, err = watchPods(runCtx, h.client, cfg.Namespace); err != nil {
		close(h.done)
		return nil, err
	}
	go func() {
		defer close(h.done)
		h.heartbeats.run(runCtx)
	}()
	if err := h.waitExtenderSeesNodes(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

// waitExtenderSeesNodes waits until the extender exports the schedulable memory of every hollow
// GPU: its informers have seen every Node.
func (h *Harness) waitExtenderSeesNodes(ctx context.Context) error {
	want := gpuCount(h.cfg.Nodes)
	return waitUntil(ctx, 2*time.Minute, "the extender to see every hollow node's GPUs", func(ctx context.Context) (bool, error) {
		s, err := scrapeExtender(ctx, h.Cluster.ExtenderURL()+"/metrics")
		if err != nil {
			return false, nil //nolint:nilerr // not up yet: keep waiting
		}
		return s.gpus >= want, nil
	})
}

// Client returns the harness's client (protobuf, high QPS).
func (h *Harness) Client() kubernetes.Interface { return h.client }

// Stop stops the heartbeats, the pod watch and the cluster, and removes the cluster's and the
// harness's folders. It is idempotent.
func (h *Harness) Stop() error {
	if h.stop != nil {
		h.stop()
		<-h.done
		h.stop = nil
	}
	var errs []error
	if h.Cluster != nil {
		errs = append(errs, h.Cluster.Stop())
	}
	if h.configDir != "" {
		errs = append(errs, os.RemoveAll(h.configDir))
	}
	return errors.Join(errs...)
}

// Build builds gpuslice-scheduler and gpuslice-webhook from the product module at root into
// dir and returns their paths, so that a harness runs the code of the tree it is in.
func Build(ctx context.Context, root, dir string) (extenderPath, webhookPath string, err error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "grpcnotrace", "-o", dir+string(filepath.Separator), "./cmd/gpuslice-scheduler", "./cmd/gpuslice-webhook") //nolint:gosec // G204: building this tree is the caller's request
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build the extender and the webhook in %s: %w\n%s", root, err, out)
	}
	return filepath.Join(dir, cluster.ExtenderName), filepath.Join(dir, cluster.WebhookName), nil
}

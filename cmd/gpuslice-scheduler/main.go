// Command gpuslice-scheduler is gpuslice's scheduler extender: the HTTP
// filter/prioritize/bind endpoints a stock kube-scheduler calls for pods
// that ask for hami.io resources. It only wires flags, the Kubernetes
// client and signals; the behaviour lives in package extender.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/internal/configfile"
	"github.com/gpuslice/gpuslice/internal/kubeclient"
)

// version is stamped at build time with -ldflags "-X main.version=…".
var version = "dev"

const name = "gpuslice-scheduler"

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run returns the process exit code: 0 after a clean stop (SIGTERM or
// SIGINT), 1 when the extender cannot start or fails, 2 for bad flags or
// configuration. Errors are printed to stderr on one line.
func run(args []string, stderr io.Writer) int {
	cfg, kubeconfig, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err))
		return 2
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(cfg.GCPercent)
	}
	client, err := kubeClient(kubeconfig, cfg.KubeAPIQPS, cfg.KubeAPIBurst)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err))
		return 1
	}
	events, err := kubeClient(kubeconfig, eventQPS, eventBurst)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err))
		return 1
	}
	s, err := extender.New(cfg, extender.Options{Client: client, EventClient: events})
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err))
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.Background().WithName(name)
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Starting", "version", version, "address", cfg.Address, "nodePolicy", cfg.NodePolicy, "gpuPolicy", cfg.GPUPolicy)
	if err := s.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err))
		return 1
	}
	logger.Info("Stopped")
	return 0
}

// parseFlags builds the Config: defaults, then the --config file, then the
// flags given on the command line. Flags are bound to the Config itself;
// when a file is read, the flags that were set are applied again on top.
func parseFlags(args []string, stderr io.Writer) (extender.Config, string, error) {
	cfg := extender.DefaultConfig()
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	klog.InitFlags(fs)
	configFile := fs.String("config", "", "YAML or JSON file with the extender configuration; flags given on the command line override it")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster (default: in-cluster)")
	fs.StringVar(&cfg.Address, "address", cfg.Address, "host:port to serve on; beyond loopback only with --client-ca-file and --allowed-client-names")
	fs.StringVar(&cfg.HealthAddress, "health-address", cfg.HealthAddress, "optional second host:port serving only /healthz, /readyz and /metrics over plain HTTP, for probes and scraping")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert-file", cfg.TLSCertFile, "PEM serving certificate; serves HTTPS when set and re-reads it when it changes")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key-file", cfg.TLSKeyFile, "PEM private key of --tls-cert-file")
	fs.StringVar(&cfg.ClientCAFile, "client-ca-file", cfg.ClientCAFile, "PEM CA bundle; when set, /filter, /prioritize and /bind require a client certificate it signed whose subject is in --allowed-client-names (needs --tls-cert-file)")
	fs.Func("allowed-client-names", "comma-separated client certificate subjects (common name or DNS name) that may call the API; required with --client-ca-file", func(v string) error {
		cfg.AllowedClientNames = nil
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				cfg.AllowedClientNames = append(cfg.AllowedClientNames, n)
			}
		}
		return nil
	})
	fs.StringVar((*string)(&cfg.NodePolicy), "node-policy", string(cfg.NodePolicy), "default node policy: binpack, spread or fragmentation")
	fs.StringVar((*string)(&cfg.GPUPolicy), "gpu-policy", string(cfg.GPUPolicy), "default GPU policy: binpack, spread or fragmentation")
	fs.DurationVar(&cfg.HeartbeatMaxAge.Duration, "heartbeat-max-age", cfg.HeartbeatMaxAge.Duration, "oldest device-plugin heartbeat Lease renewal that still counts as alive")
	fs.StringVar(&cfg.HeartbeatNamespace, "heartbeat-namespace", cfg.HeartbeatNamespace, "namespace of the device plugins' heartbeat Leases")
	fs.StringVar(&cfg.ResourceName, "resource-name", cfg.ResourceName, "extended resource the device plugins register")
	fs.DurationVar(&cfg.BindTimeout.Duration, "bind-timeout", cfg.BindTimeout.Duration, "time allowed for one bind's API requests; keep below the extender httpTimeout")
	fs.DurationVar(&cfg.BindOutcomeWait.Duration, "bind-outcome-wait", cfg.BindOutcomeWait.Duration, "how long a pod whose Binding had an unknown outcome keeps its GPUs while the API server shows it unbound; above kube-apiserver's --request-timeout")
	fs.Func("kube-api-qps", fmt.Sprintf("API client requests per second (default %d)", extender.DefaultKubeAPIQPS), func(v string) error {
		f, err := strconv.ParseFloat(v, 32)
		cfg.KubeAPIQPS = float32(f)
		return err
	})
	fs.IntVar(&cfg.KubeAPIBurst, "kube-api-burst", cfg.KubeAPIBurst, "API client burst")
	fs.IntVar(&cfg.PercentageOfNodesToScore, "percentage-of-nodes-to-score", cfg.PercentageOfNodesToScore, "the calling kube-scheduler profile's percentageOfNodesToScore (0: adaptive), to tell when it sends a sample of the nodes")
	fs.StringVar((*string)(&cfg.FilterResult), "filter-result", string(cfg.FilterResult), "nodes /filter passes for a GPU pod: best (only the best score tier, 0-10; the profile needs no prioritizeVerb) or feasible (every node where it fits, scored by /prioritize)")
	fs.StringVar((*string)(&cfg.Workload), "workload", string(cfg.Workload), "what the fragmentation policy measures against: online (learnt from the pods seen) or default (vgpu's default workload)")
	fs.IntVar(&cfg.WorkloadHalfLife, "workload-half-life", cfg.WorkloadHalfLife, "pods after which a pod counts half as much in the online workload")
	fs.StringVar(&cfg.LeaderLease, "leader-lease", cfg.LeaderLease, "namespace/name of kube-scheduler's leader-election Lease: retry pods and maintain the nodes' GPUSliceRegistered condition only while it names the kube-scheduler beside this extender (default: always, a single replica)")
	fs.IntVar(&cfg.GCPercent, "gc-percent", cfg.GCPercent, "the Go garbage collector's target (GOGC, 10-1000); the GOGC environment variable wins")
	fs.BoolVar(&cfg.DRA, "dra", cfg.DRA, "score the nodes of pods whose claims ask for gpuslice's DRA devices on /dra/prioritize (watches ResourceSlices, ResourceClaims and DeviceClasses)")
	fs.IntVar(&cfg.MaxPendingBinds, "max-pending-binds", cfg.MaxPendingBinds, "binds that may wait for the API client; more are refused at once (0: kube-api-qps × bind-timeout / 2, at least kube-api-burst)")
	if err := configfile.Parse(fs, args, &cfg, extender.DefaultConfig(), configFile); err != nil {
		return cfg, "", err
	}
	return cfg, *kubeconfig, cfg.Validate()
}

// oneLine joins the lines of a joined error with "; ".
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

// The events client's rate: its own limiter, so that placement events
// never delay binds; a burst beyond it waits in the extender's bounded
// event queue, and what overflows that is dropped.
const (
	eventQPS   = 50
	eventBurst = 100
)

// kubeClient returns a client from kubeconfig, or in-cluster when empty,
// limited to qps requests per second with burst.
func kubeClient(kubeconfig string, qps float32, burst int) (kubernetes.Interface, error) {
	cfg, err := kubeclient.Config(kubeconfig, name+"/"+version)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w (set --kubeconfig outside a cluster)", err)
	}
	// A bind is one request; client-go's default 5 QPS would queue a
	// 40-pod job for seconds.
	cfg.QPS, cfg.Burst = qps, burst
	// Protobuf, as kube-scheduler's own client: every pod, Node and Lease
	// event the informers watch decodes in a fraction of JSON's CPU and
	// garbage, which matters at thousands of nodes.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return kubernetes.NewForConfig(cfg)
}

// Command gpuslice-device-plugin is gpuslice's node agent: it finds the
// node's GPUs through NVML (or fake GPUs), registers hami.io/gpu with the
// kubelet and publishes the node's GPU inventory. It only wires flags,
// backends and signals; the behaviour lives in package deviceplugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/internal/configfile"
	"github.com/gpuslice/gpuslice/internal/kubeclient"
	"github.com/gpuslice/gpuslice/internal/probe"
	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/vgpu"
)

// version is stamped at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

// run returns the process exit code: 0 after a clean stop, 1 when the
// plugin cannot start, 2 for bad flags or configuration. Errors are printed
// on one line.
func run(args []string) int {
	const name = "gpuslice-device-plugin"
	cfg, kubeconfig, err := parseFlags(name, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.Background().WithName(name)
	ctx = klog.NewContext(ctx, logger)

	client, err := kubeClient(kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	backend, err := openBackend(ctx, cfg, logger)
	var fieldErr *vgpu.FieldError
	switch {
	case errors.As(err, &fieldErr):
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		if errors.Is(err, nvidia.ErrNoDriver) && client != nil {
			reportNoDriver(ctx, client, cfg.NodeName, err)
		}
		return 1
	}
	defer func() { _ = backend.Close() }()
	facts, err := nodeFacts(cfg, backend)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}

	plugin, err := deviceplugin.New(cfg, backend, deviceplugin.Options{Client: client, PluginVersion: version, Facts: facts})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			logger.Info("SIGHUP: registering again")
			plugin.Reregister()
		}
	}()

	if cfg.HealthAddress != "" {
		stopProbes, err := probe.Serve(ctx, cfg.HealthAddress, plugin.ProbeHandler())
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			return 1
		}
		defer stopProbes()
	}

	logger.Info("Starting", "version", version, "node", cfg.NodeName, "fakeGPUs", cfg.FakeGPUs, "mode", cfg.Mode)
	if err := plugin.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	logger.Info("Stopped")
	return 0
}

// reportNoDriver sets the Node's registration condition to DriverNotFound
// before the plugin exits, so that kubectl describe node shows why.
func reportNoDriver(ctx context.Context, client deviceplugin.API, node string, cause error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := deviceplugin.ReportStartFailure(ctx, client, node, vgpu.ReasonDriverNotFound, cause.Error(), time.Now()); err != nil {
		fmt.Fprintf(os.Stderr, "gpuslice-device-plugin: could not set the node condition: %v\n", err)
	}
}

// parseFlags builds the Config: defaults, then the --config file, then the
// flags given on the command line. Flags are bound to the Config itself; when
// a file is read, the flags that were set are applied again on top of it.
func parseFlags(name string, args []string) (deviceplugin.Config, string, error) {
	cfg := deviceplugin.DefaultConfig()
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	klog.InitFlags(fs)
	configFile := fs.String("config", "", "YAML or JSON file with the plugin configuration; flags given on the command line override it")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig for publishing inventory, heartbeat and ready label and reading pods' GPU allocations (default: in-cluster; none: do not publish, and refuse GPU containers)")
	fs.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "Node this agent runs on (default $NODE_NAME)")
	fs.StringVar(&cfg.ResourceName, "resource-name", cfg.ResourceName, "extended resource to register")
	fs.IntVar(&cfg.SplitCount, "split-count", cfg.SplitCount, "virtual devices per GPU (most pods sharing one GPU), 1-100")
	fs.Float64Var(&cfg.MemoryScaling, "memory-scaling", cfg.MemoryScaling, "factor on schedulable GPU memory; above 1 oversubscribes")
	fs.Int64Var(&cfg.ReservedMemoryMiB, "reserved-memory-mib", cfg.ReservedMemoryMiB, "MiB held back on each GPU for the driver")
	fs.Var((*configfile.List)(&cfg.ExcludeGPUs), "exclude-gpus", "comma-separated GPU UUIDs or indexes not to advertise")
	fs.StringVar(&cfg.DevicePluginDir, "device-plugin-dir", cfg.DevicePluginDir, "the kubelet's device-plugin folder")
	fs.StringVar(&cfg.HeartbeatNamespace, "heartbeat-namespace", cfg.HeartbeatNamespace, "namespace of the per-node heartbeat Lease")
	fs.DurationVar(&cfg.LeaseDuration.Duration, "lease-duration", cfg.LeaseDuration.Duration, "heartbeat Lease duration")
	fs.DurationVar(&cfg.LeaseRenew.Duration, "lease-renew", cfg.LeaseRenew.Duration, "heartbeat Lease renewal interval")
	fs.DurationVar(&cfg.HealthCoolDown.Duration, "health-cooldown", cfg.HealthCoolDown.Duration, "wait before re-probing an unhealthy GPU")
	fs.StringVar(&cfg.FakeGPUs, "fake-gpus", cfg.FakeGPUs, "use fake GPUs instead of NVML: dgxa100|dgxh100|dgxh200|dgxb200 or a list like 2xA100-80GB,1xT4-16GB")
	fs.StringVar(&cfg.FakeGPUFaultsDir, "fake-gpu-faults-dir", cfg.FakeGPUFaultsDir, "with --fake-gpus: folder to take injected faults from (files asking for an XID or a GPU reset, docs/health.md); empty takes none")
	fs.StringVar((*string)(&cfg.Mode), "mode", string(cfg.Mode), "how containers get their slice: cdi (CDI devices) or env (environment, for runtimes without CDI)")
	fs.StringVar(&cfg.CDISpecDir, "cdi-spec-dir", cfg.CDISpecDir, "folder the plugin writes its CDI specs to (mode cdi); the container runtime must read it")
	fs.StringVar(&cfg.PodResourcesSocket, "pod-resources-socket", cfg.PodResourcesSocket, "the kubelet's PodResources API socket")
	fs.StringVar(&cfg.HostLibVGPU, "host-libvgpu", cfg.HostLibVGPU, "host path of HAMi-core's libvgpu.so to preload in GPU containers (default: none)")
	fs.StringVar(&cfg.Enforcement, "enforcement", cfg.Enforcement, "enforcement mechanism: auto (the strongest the node has), driver, hami-core, mps or none")
	fs.Var((*configfile.List)(&cfg.DisabledEnforcement), "disabled-enforcement", "comma-separated mechanisms auto must not pick (driver, hami-core, mps)")
	fs.StringVar(&cfg.EnforcementDriverHook, "enforcement-driver-hook", cfg.EnforcementDriverHook, "how enforcement driver learns that the toolkit's memory-limit hook runs: detect (in the --nvidia-cdi-specs, for every GPU) or assume (the operator's word; reported unverified)")
	fs.Var((*configfile.List)(&cfg.NVIDIACDISpecs), "nvidia-cdi-specs", "comma-separated globs of the NVIDIA toolkit's CDI specs, whose GPU devices containers get under enforcement driver")
	fs.StringVar(&cfg.MPSControl, "mps-control", cfg.MPSControl, "MPS control binary, a path or a name in PATH (enforcement mps)")
	fs.StringVar(&cfg.MPSDir, "mps-dir", cfg.MPSDir, "host folder of the MPS daemons' pipes and logs, the same path in containers")
	fs.StringVar(&cfg.SharedCacheDir, "shared-cache-dir", cfg.SharedCacheDir, "container folder of CUDA_DEVICE_MEMORY_SHARED_CACHE files")
	fs.StringVar(&cfg.HealthAddress, "health-address", cfg.HealthAddress, "host:port of /readyz (registered with the kubelet), /healthz and /metrics; empty serves none")
	fs.StringVar(&cfg.ProcDir, "proc-dir", cfg.ProcDir, "the host's /proc (host PIDs), whose cgroups attribute GPU processes to containers")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "folder for the plugin's checkpoint and ld.so.preload, the same path on the host (default <device-plugin-dir>/gpuslice-state)")
	if err := configfile.Parse(fs, args, &cfg, deviceplugin.DefaultConfig(), configFile); err != nil {
		return cfg, "", err
	}
	return cfg, *kubeconfig, cfg.Validate()
}

// openBackend opens NVML, or fake GPUs when configured, keeping the
// records of GPUs that need a reset in the state folder. With a faults
// folder, the fake GPUs keep their recovery actions there and take faults
// from it until ctx ends. A bad fake spec or faults folder is a
// configuration error; anything else means the plugin cannot start.
func openBackend(ctx context.Context, cfg deviceplugin.Config, logger klog.Logger) (*nvidia.Backend, error) {
	opts := nvidia.Options{
		CoolDown: cfg.HealthCoolDown.Duration, Logger: logger.WithName("nvml"),
		FaultRecordDir: cfg.FaultRecordDir(), BootID: bootID(),
	}
	if cfg.FakeGPUs == "" {
		return nvidia.Open(opts)
	}
	fake, err := nvidia.NewFake(cfg.FakeGPUs, cfg.NodeName)
	if err != nil {
		return nil, vgpu.InvalidField("fakeGPUs", cfg.FakeGPUs, err.Error())
	}
	if dir := cfg.FakeGPUFaultsDir; dir != "" {
		if _, err := os.ReadDir(dir); err != nil {
			return nil, vgpu.InvalidField("fakeGPUFaultsDir", dir, "must be a folder that exists and can be read: "+err.Error())
		}
		if err := fake.KeepStateIn(dir); err != nil {
			return nil, vgpu.InvalidField("fakeGPUFaultsDir", dir, err.Error())
		}
	}
	opts.Library = fake
	backend, err := nvidia.Open(opts)
	if err != nil || cfg.FakeGPUFaultsDir == "" {
		return backend, err
	}
	go func() {
		faultsCtx := klog.NewContext(ctx, logger.WithName("fake-faults"))
		if err := fake.ServeFaults(faultsCtx, cfg.FakeGPUFaultsDir, nvidia.FaultOptions{}); err != nil && !errors.Is(err, context.Canceled) {
			logger.Error(err, "Fake GPU faults folder stopped")
		}
	}()
	return backend, nil
}

// bootIDFile holds the kernel's ID of the current boot (the host's, also
// in a container).
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// bootID returns the current boot's ID, or "" when it cannot be read.
func bootID() string {
	data, err := os.ReadFile(bootIDFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// cgroupRoot is where the node's cgroup file system is mounted.
const cgroupRoot = "/sys/fs/cgroup"

// nodeFacts detects what the node offers for enforcement: the driver
// version from NVML, the cgroup version from cgroupRoot, the MPS control
// binary from cfg.MPSControl. Fake GPUs report their spec's facts instead
// (the host's cgroup version unless the spec names one; MPS only when the
// spec says mps, and then the configured binary must exist).
func nodeFacts(cfg deviceplugin.Config, backend *nvidia.Backend) (handoff.NodeFacts, error) {
	driver, err := backend.DriverVersion()
	if err != nil {
		return handoff.NodeFacts{}, err
	}
	facts := handoff.DetectNodeFacts(driver, cgroupRoot, cfg.MPSControl)
	if cfg.FakeGPUs == "" {
		return facts, nil
	}
	fake, err := nvidia.ParseFakeFacts(cfg.FakeGPUs)
	if err != nil {
		return handoff.NodeFacts{}, vgpu.InvalidField("fakeGPUs", cfg.FakeGPUs, err.Error())
	}
	if fake.CgroupVersion != 0 {
		facts.CgroupVersion = fake.CgroupVersion
	}
	if !fake.MPS {
		facts.MPSControl = ""
	} else if facts.MPSControl == "" {
		return handoff.NodeFacts{}, fmt.Errorf("fake GPUs %q report MPS, but the MPS control binary %q is not found", cfg.FakeGPUs, cfg.MPSControl)
	}
	return facts, nil
}

// kubeClient returns the plugin's API client from kubeconfig, or
// in-cluster, or nil when neither is available (the plugin then serves the
// kubelet only).
func kubeClient(kubeconfig string) (deviceplugin.API, error) {
	cfg, err := kubeclient.Config(kubeconfig, "gpuslice-device-plugin/"+version)
	switch {
	case errors.Is(err, rest.ErrNotInCluster):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return deviceplugin.NewAPI(cfg)
}

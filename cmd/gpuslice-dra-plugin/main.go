// Command gpuslice-dra-plugin is gpuslice's node agent in DRA mode: it
// finds the node's GPUs through NVML (or fake GPUs), publishes them as one
// ResourceSlice pool with consumable memory and cores, and prepares
// ResourceClaims by writing CDI specs with the same environment as the
// device plugin. It only wires flags, backends and signals; the behaviour
// lives in package dra.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/dra"
	"github.com/gpuslice/gpuslice/internal/configfile"
	"github.com/gpuslice/gpuslice/internal/kubeclient"
	"github.com/gpuslice/gpuslice/internal/probe"
	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/node/publish"
	publishclient "github.com/gpuslice/gpuslice/node/publish/clientset"
	"github.com/gpuslice/gpuslice/vgpu"
)

// version is stamped at build time with -ldflags "-X main.version=…".
var version = "dev"

// cgroupRoot is where the node's cgroup file system is mounted.
const cgroupRoot = "/sys/fs/cgroup"

func main() {
	os.Exit(run(os.Args[1:]))
}

// flags are the command line beyond dra.Config.
type flags struct {
	kubeconfig, fakeFaultsDir string
}

// run returns the process exit code: 0 after a clean stop, 1 when the
// driver cannot start, 2 for bad flags or configuration.
func run(args []string) int {
	const name = "gpuslice-dra-plugin"
	cfg, fl, err := parseFlags(name, args)
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

	rc, err := kubeclient.Config(fl.kubeconfig, name+"/"+version)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	backend, facts, err := openBackend(ctx, cfg, fl.fakeFaultsDir, logger)
	var fieldErr *vgpu.FieldError
	switch {
	case errors.As(err, &fieldErr):
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		// Say why on the Node, as the device plugin does, so that doctor
		// and kubectl describe node tell it without the driver's log.
		if errors.Is(err, nvidia.ErrNoDriver) {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if rerr := publish.ReportStartFailure(rctx, publishclient.New(client), cfg.NodeName, dra.FieldManager, vgpu.ReasonDriverNotFound, err.Error(), time.Now()); rerr != nil {
				fmt.Fprintf(os.Stderr, "%s: could not set the node condition: %v\n", name, rerr)
			}
		}
		return 1
	}
	defer func() { _ = backend.Close() }()

	driver, err := dra.New(cfg, backend, dra.Options{Client: client, Facts: facts, Version: version})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	if cfg.HealthAddress != "" {
		stopProbes, err := probe.Serve(ctx, cfg.HealthAddress, driver.ProbeHandler())
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			return 1
		}
		defer stopProbes()
	}
	logger.Info("Starting", "version", version, "driver", cfg.DriverName, "node", cfg.NodeName, "fakeGPUs", cfg.FakeGPUs)
	if err := driver.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	logger.Info("Stopped")
	return 0
}

// parseFlags builds the Config: defaults, then the --config file, then the
// flags given on the command line.
func parseFlags(name string, args []string) (dra.Config, flags, error) {
	cfg := dra.DefaultConfig()
	cfg.NodeName = os.Getenv("NODE_NAME")
	var fl flags
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	klog.InitFlags(fs)
	configFile := fs.String("config", "", "YAML or JSON file with the driver configuration; flags given on the command line override it")
	fs.StringVar(&fl.kubeconfig, "kubeconfig", "", "kubeconfig for reading claims and publishing ResourceSlices (default: in-cluster)")
	fs.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "Node this driver runs on (default $NODE_NAME)")
	fs.StringVar(&cfg.DriverName, "driver-name", cfg.DriverName, "DRA driver name")
	fs.Float64Var(&cfg.MemoryScaling, "memory-scaling", cfg.MemoryScaling, "factor on schedulable GPU memory; above 1 oversubscribes")
	fs.Int64Var(&cfg.ReservedMemoryMiB, "reserved-memory-mib", cfg.ReservedMemoryMiB, "MiB held back on each GPU for the driver")
	fs.Var((*configfile.List)(&cfg.ExcludeGPUs), "exclude-gpus", "comma-separated GPU UUIDs or indexes not to publish")
	fs.StringVar(&cfg.RegistrarDir, "registrar-dir", cfg.RegistrarDir, "the kubelet's plugin registration folder")
	fs.StringVar(&cfg.PluginDir, "plugin-dir", cfg.PluginDir, "the driver's folder for its DRA socket")
	fs.StringVar(&cfg.CDISpecDir, "cdi-spec-dir", cfg.CDISpecDir, "folder the driver writes CDI specs to; the container runtime must read it")
	fs.StringVar(&cfg.SharedCacheDir, "shared-cache-dir", cfg.SharedCacheDir, "container folder of CUDA_DEVICE_MEMORY_SHARED_CACHE files")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "host folder of the ld.so.preload file containers mount")
	fs.StringVar(&cfg.FakeGPUs, "fake-gpus", cfg.FakeGPUs, "use fake GPUs instead of NVML: dgxa100|dgxh100|dgxh200|dgxb200 or a list like 2xA100-80GB,1xT4-16GB")
	fs.StringVar(&fl.fakeFaultsDir, "fake-gpu-faults-dir", "", "with --fake-gpus: folder to take injected faults from (docs/health.md); empty takes none")
	fs.StringVar(&cfg.Enforcement.HostLibVGPU, "host-libvgpu", cfg.Enforcement.HostLibVGPU, "host path of HAMi-core's libvgpu.so to preload in GPU containers (default: none)")
	fs.StringVar(&cfg.Enforcement.Enforcement, "enforcement", cfg.Enforcement.Enforcement, "enforcement mechanism: auto, driver, hami-core, mps or none")
	fs.StringVar(&cfg.HealthAddress, "health-address", cfg.HealthAddress, "host:port of /readyz (registered with the kubelet, ResourceSlice handed over) and /healthz; empty serves none")
	fs.StringVar(&cfg.MPSDir, "mps-dir", cfg.MPSDir, "host folder of the MPS daemons' pipes")
	if err := configfile.Parse(fs, args, &cfg, dra.DefaultConfig(), configFile); err != nil {
		return cfg, fl, err
	}
	return cfg, fl, cfg.Validate()
}

// openBackend opens NVML, or fake GPUs (taking faults from faultsDir), and
// detects the node's enforcement facts.
func openBackend(ctx context.Context, cfg dra.Config, faultsDir string, logger klog.Logger) (*nvidia.Backend, handoff.NodeFacts, error) {
	opts := nvidia.Options{Logger: logger.WithName("nvml")}
	var fake *nvidia.Fake
	if cfg.FakeGPUs != "" {
		var err error
		if fake, err = nvidia.NewFake(cfg.FakeGPUs, cfg.NodeName); err != nil {
			return nil, handoff.NodeFacts{}, vgpu.InvalidField("fakeGPUs", cfg.FakeGPUs, err.Error())
		}
		opts.Library = fake
	}
	backend, err := nvidia.Open(opts)
	if err != nil {
		return nil, handoff.NodeFacts{}, err
	}
	driver, err := backend.DriverVersion()
	if err != nil {
		_ = backend.Close()
		return nil, handoff.NodeFacts{}, err
	}
	facts := handoff.DetectNodeFacts(driver, cgroupRoot, cfg.Enforcement.MPSControl)
	if fake != nil {
		facts.MPSControl = ""
		if faultsDir != "" {
			go func() {
				if err := fake.ServeFaults(klog.NewContext(ctx, logger.WithName("fake-faults")), faultsDir, nvidia.FaultOptions{}); err != nil && !errors.Is(err, context.Canceled) {
					logger.Error(err, "Fake GPU faults folder stopped")
				}
			}()
		}
	}
	return backend, facts, nil
}

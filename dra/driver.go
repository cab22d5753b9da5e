package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/publish"
	publishclient "github.com/gpuslice/gpuslice/node/publish/clientset"
	"github.com/gpuslice/gpuslice/vgpu"
)

// GPUBackend is what the driver needs from the GPU driver (NVML or fake
// GPUs); node/nvidia's Backend is one.
type GPUBackend interface {
	// GPUs lists the node's physical GPUs with their current health.
	GPUs() ([]vgpu.GPU, error)
	// WatchHealth blocks until ctx ends, sending one event per health change.
	WatchHealth(ctx context.Context, events chan<- vgpu.HealthEvent) error
}

// Options are the driver's injected parts.
type Options struct {
	// Client reads claims and writes ResourceSlices; required.
	Client kubernetes.Interface
	// Clock stamps device taints. Default: the real clock.
	Clock clock.PassiveClock
	// Facts decide the enforcement mechanism (handoff.DetectNodeFacts).
	Facts handoff.NodeFacts
	// Published, if set, is called after every ResourceSlice update the
	// driver hands the helper, with the devices published.
	Published func(devices []resourceapi.Device)
	// Version is the driver's build version, written into its heartbeat.
	Version string
}

// Driver is the DRA kubelet plugin. Create it with New and run it with Run;
// the helper calls its DRAPlugin methods from its gRPC server.
type Driver struct {
	cfg     Config
	backend GPUBackend
	opts    Options

	mu             sync.Mutex
	gpus           []vgpu.GPU // schedulable, by index
	unhealthySince map[string]metav1.Time
	builder        *handoff.Builder
	helper         *kubeletplugin.Helper
	published      bool // a ResourceSlice was handed to the helper
	mech           vgpu.Enforcement
	// reg is the kubelet's answer to the registration (pollRegistration);
	// regSig and invSig are closed and replaced when reg or the GPUs'
	// health change, to wake the publisher.
	reg            publish.Registration
	regSig, invSig chan struct{}
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New validates cfg and returns a driver that is not yet running.
func New(cfg Config, backend GPUBackend, opts Options) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if backend == nil {
		return nil, errors.New("dra: no GPU backend")
	}
	if opts.Client == nil {
		return nil, errors.New("dra: no Kubernetes client: the driver reads claims and publishes ResourceSlices")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Driver{cfg: cfg, backend: backend, opts: opts, unhealthySince: map[string]metav1.Time{}, regSig: make(chan struct{}), invSig: make(chan struct{})}, nil
}

// Run lists the GPUs, chooses the enforcement mechanism, starts the
// kubelet plugin (registration and DRA sockets), publishes the node's
// ResourceSlice and keeps it current with GPU health until ctx ends, then
// stops the plugin. Meanwhile a publisher (node/publish) keeps the Node's
// vgpu.ConditionRegistered and the heartbeat Lease current, as the device
// plugin's does. The ResourceSlice stays: running pods keep their
// devices while the driver restarts. It returns an error only when it
// cannot start.
func (d *Driver) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("driver", d.cfg.DriverName, "node", d.cfg.NodeName)
	ctx = klog.NewContext(ctx, logger)
	listed, err := d.backend.GPUs()
	if err != nil {
		return fmt.Errorf("list GPUs: %w", err)
	}
	gpus, err := schedulableGPUs(d.cfg, listed)
	if err != nil {
		return err
	}
	mech, _, err := handoff.ChooseEnforcement(d.cfg.Enforcement, d.opts.Facts)
	if err != nil {
		return err
	}
	for _, dir := range []string{d.cfg.CDISpecDir, d.cfg.StateDir, d.cfg.PluginDir, d.cfg.RegistrarDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // G301: runtimes read CDI specs and mount from the state folder.
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	if d.cfg.Enforcement.HostLibVGPU != "" {
		if err := handoff.EnsureFile(d.cfg.StateDir, handoff.PreloadFileName, handoff.PreloadContent, 0o644); err != nil {
			return err
		}
	}
	d.mu.Lock()
	d.gpus = gpus
	d.mech = mech
	d.builder = &handoff.Builder{
		NodeName: d.cfg.NodeName, GPU: d.gpuByUUID, SharedCacheDir: d.cfg.SharedCacheDir, FakeGPUs: d.cfg.FakeGPUs != "",
		Enforcement: mech, HostLibVGPU: d.cfg.Enforcement.HostLibVGPU, StateDir: d.cfg.StateDir, MPSDir: d.cfg.MPSDir,
	}
	d.mu.Unlock()
	logger.Info("Publishing GPUs", "gpus", len(gpus), "excluded", len(listed)-len(gpus), "enforcement", mech)

	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(d.cfg.DriverName),
		kubeletplugin.NodeName(d.cfg.NodeName),
		kubeletplugin.KubeClient(d.opts.Client),
		kubeletplugin.RegistrarDirectoryPath(d.cfg.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(d.cfg.PluginDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	d.mu.Lock()
	d.helper = helper
	d.mu.Unlock()
	if err := d.publish(ctx); err != nil {
		return err
	}

	pub, err := publish.New(publishclient.New(d.opts.Client), d.publishConfig(d.opts.Version), d, nil)
	if err != nil {
		return err
	}
	events := make(chan vgpu.HealthEvent)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { d.pollRegistration(ctx) })
	wg.Go(func() { pub.Run(ctx) })
	wg.Go(func() {
		if err := d.backend.WatchHealth(ctx, events); err != nil {
			logger.Error(err, "GPU health watch ended; health changes will not be seen")
		}
	})
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-events:
			if d.setHealth(ev) {
				logger.Info("GPU health changed", "gpu", ev.UUID, "health", ev.Health, "reason", ev.Reason)
				if err := d.publish(ctx); err != nil {
					logger.Error(err, "Publishing the ResourceSlice")
				}
				d.inventoryChanged()
			}
		}
	}
}

// setHealth applies a health event; it reports whether anything changed.
func (d *Driver) setHealth(ev vgpu.HealthEvent) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := slices.IndexFunc(d.gpus, func(g vgpu.GPU) bool { return g.UUID == ev.UUID })
	if i < 0 || d.gpus[i].Health == ev.Health {
		return false
	}
	d.gpus[i].Health = ev.Health
	if ev.Health == vgpu.Healthy {
		delete(d.unhealthySince, ev.UUID)
	} else {
		d.unhealthySince[ev.UUID] = metav1.NewTime(d.opts.Clock.Now().Truncate(1e9))
	}
	return true
}

// publish hands the helper the node's pool: one slice with every GPU.
func (d *Driver) publish(ctx context.Context) error {
	d.mu.Lock()
	devices := Devices(d.gpus, d.opts.Facts.DriverVersion, d.unhealthySince)
	helper := d.helper
	d.mu.Unlock()
	err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.cfg.NodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}})
	if err != nil {
		return fmt.Errorf("publish ResourceSlice: %w", err)
	}
	d.mu.Lock()
	d.published = true
	d.mu.Unlock()
	if d.opts.Published != nil {
		d.opts.Published(devices)
	}
	return nil
}

// gpuByUUID returns the published GPU with uuid.
func (d *Driver) gpuByUUID(uuid string) (vgpu.GPU, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, g := range d.gpus {
		if g.UUID == uuid {
			return g, true
		}
	}
	return vgpu.GPU{}, false
}

// gpuByDevice returns the published GPU with a ResourceSlice device name.
func (d *Driver) gpuByDevice(name string) (vgpu.GPU, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, g := range d.gpus {
		if DeviceName(g.Index) == name {
			return g, true
		}
	}
	return vgpu.GPU{}, false
}

// PrepareResourceClaims writes, for every request of every claim, the CDI
// spec of its GPU slices and answers its CDI device. It is idempotent: the
// answer and the spec depend on the claim only. A claim that cannot be
// prepared gets its own error; the others are prepared.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devices, err := d.prepare(claim)
		if err != nil {
			logger.Error(err, "Preparing claim", "claim", klog.KObj(claim))
		} else {
			logger.V(2).Info("Prepared claim", "claim", klog.KObj(claim), "devices", devices)
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Err: err, Devices: devices}
	}
	return out, nil
}

// prepare writes the specs of one claim and returns its devices.
func (d *Driver) prepare(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	grants, err := Grants(d.cfg.DriverName, claim, d.gpuByDevice)
	if err != nil {
		return nil, err
	}
	pod, podUID := consumer(claim)
	var devices []kubeletplugin.Device
	byName := map[string]*vgpu.ContainerAllocation{}
	var order []string
	for _, g := range grants {
		ca, ok := byName[g.CDIName]
		if !ok {
			ca = &vgpu.ContainerAllocation{Name: g.Request}
			byName[g.CDIName] = ca
			order = append(order, g.CDIName)
		}
		ca.GPUs = append(ca.GPUs, g.Slice)
		dev := kubeletplugin.Device{Requests: []string{g.Request}, PoolName: g.Pool, DeviceName: g.Device, ShareID: g.ShareID}
		if !ok {
			dev.CDIDeviceIDs = []string{handoff.CDIQualifiedName(g.CDIName)}
		}
		devices = append(devices, dev)
	}
	for _, name := range order {
		owner := handoff.Owner{Namespace: claim.Namespace, Pod: pod, PodUID: string(podUID), CacheKey: name}
		edits, err := d.builder.EditsForOwner(owner, *byName[name])
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
		spec, err := handoff.BuildSpec(name, edits)
		if err == nil {
			err = handoff.WriteSpec(d.cfg.CDISpecDir, spec)
		}
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s: write the CDI spec of %s: %w", claim.Namespace, claim.Name, handoff.CDIQualifiedName(name), err)
		}
	}
	return devices, nil
}

// UnprepareResourceClaims removes the CDI specs of claims. A claim that was
// never prepared, or already unprepared, is no error.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	entries, err := os.ReadDir(d.cfg.CDISpecDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", d.cfg.CDISpecDir, err)
	}
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		var errs []error
		for _, e := range entries {
			name, ok := handoff.DeviceOfFile(e.Name())
			if !ok || !strings.HasPrefix(name, string(claim.UID)+"-") {
				continue
			}
			if err := os.Remove(filepath.Join(d.cfg.CDISpecDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		out[claim.UID] = errors.Join(errs...)
		klog.FromContext(ctx).V(2).Info("Unprepared claim", "claim", claim.NamespacedName, "uid", claim.UID)
	}
	return out, nil
}

// HandleError logs background errors of the helper (ResourceSlice
// publishing); all of them are retried.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
}

// WatchHealthStatus is not offered: GPU health reaches the scheduler as
// device taints in the ResourceSlice instead.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

package deviceplugin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuslice/gpuslice/internal/eventqueue"
	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/publish"
	"github.com/gpuslice/gpuslice/vgpu"
)

// GPUBackend is what the plugin needs from the GPU driver (NVML or fake GPUs).
type GPUBackend interface {
	// GPUs lists the node's physical GPUs with their current health.
	GPUs() ([]vgpu.GPU, error)
	// WatchHealth blocks until ctx ends, sending one event per health change.
	WatchHealth(ctx context.Context, events chan<- vgpu.HealthEvent) error
}

// Options are the plugin's injected parts. Zero fields take defaults.
type Options struct {
	// Client publishes inventory, heartbeat and label, watches the node's
	// pods for their GPU allocations and records events (NewAPI). Nil
	// disables all of that: the plugin still serves and registers, but
	// refuses to start GPU containers, since it cannot read their
	// allocations.
	Client API
	// Clock drives lease renewal, retry timers and stale-spec collection.
	// Default: the real clock.
	Clock clock.WithTicker
	// PluginVersion is reported in the heartbeat.
	PluginVersion string
	// Registry receives the plugin's metrics (docs/metrics.md), served on
	// GET /metrics of ProbeHandler. Nil means a new registry with the Go
	// runtime and process collectors; a given registry gets only the
	// plugin's own metrics, and New fails if they are already registered
	// there.
	Registry *prometheus.Registry
	// Facts are what the node offers for enforcement (DetectNodeFacts, or
	// fake GPUs'); they decide Config.Enforcement "auto". The zero value
	// offers nothing beyond Config.HostLibVGPU.
	Facts handoff.NodeFacts
}

// eventQueueSize is how many events may wait to be written; more are
// dropped (eventqueue.Queue).
const eventQueueSize = 64

// eventRecorder records events on pods and on the Node. It is the Eventf
// of client-go's record.EventRecorder, so that tests can use
// record.FakeRecorder; the plugin's is an eventqueue.Queue.
type eventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Plugin is the node agent for one resource. Create it with New and run it
// with Run; Registered and Reregister may be called from any goroutine.
type Plugin struct {
	cfg     Config
	backend GPUBackend
	opts    Options

	// instance names this plugin's sockets apart from any earlier plugin's
	// (see socketName).
	instance   string
	reregister chan struct{}
	metrics    *pluginMetrics
	// inv is the inventory Run advertises, nil before Run lists the GPUs;
	// the metrics read GPU health from it.
	inv atomic.Pointer[inventory]
	// alloc is the allocator Run hands the kubelet's calls to, nil before;
	// the metrics read its pod view and PodResources lister.
	alloc atomic.Pointer[allocator]

	mu     sync.Mutex
	reg    registration
	regSig chan struct{} // closed and replaced when reg changes

	// events records Node events; nil without Options.Client. Set by Run
	// before anything reads it.
	events eventRecorder
}

// registration is the plugin's standing with the kubelet.
type registration = publish.Registration

// New validates cfg and returns a plugin that is not yet running, with its
// metrics registered (Options.Registry).
func New(cfg Config, backend GPUBackend, opts Options) (*Plugin, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if backend == nil {
		return nil, errors.New("deviceplugin: no GPU backend")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	var token [4]byte
	if _, err := rand.Read(token[:]); err != nil {
		return nil, fmt.Errorf("deviceplugin: socket name token: %w", err)
	}
	p := &Plugin{
		cfg:        cfg,
		backend:    backend,
		opts:       opts,
		instance:   hex.EncodeToString(token[:]),
		reregister: make(chan struct{}, 1),
		regSig:     make(chan struct{}),
	}
	m, err := newPluginMetrics(p, opts.Registry)
	if err != nil {
		return nil, err
	}
	p.metrics = m
	return p, nil
}

// Registered reports whether the kubelet has accepted the current endpoint.
func (p *Plugin) Registered() bool {
	r, _ := p.registration()
	return r.Registered
}

// Reregister asks Run to register again on a fresh socket (SIGHUP). It
// never blocks; requests made while one is pending are merged.
func (p *Plugin) Reregister() {
	select {
	case p.reregister <- struct{}{}:
	default:
	}
}

func (p *Plugin) registration() (registration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reg, p.regSig
}

func (p *Plugin) setRegistration(r registration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setRegistrationLocked(r)
}

// setProblem records why the plugin is not registered. It changes
// nothing (and wakes no one) when the problem is the one already
// recorded; Since is when the problem state began.
func (p *Plugin) setProblem(reason, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reg.Registered && p.reg.Problem == reason && p.reg.Detail == detail {
		return
	}
	since := p.reg.Since
	if p.reg.Registered || p.reg.Problem == "" || since.IsZero() {
		since = p.opts.Clock.Now()
	}
	p.setRegistrationLocked(registration{Problem: reason, Detail: detail, Since: since})
}

func (p *Plugin) setRegistrationLocked(r registration) {
	p.reg = r
	close(p.regSig)
	p.regSig = make(chan struct{})
}

// Run serves and registers until ctx ends, then stops the server, removes
// its socket, marks the node not ready and returns nil. It returns an error
// only when it cannot start at all (GPU listing fails, the device-plugin,
// state or CDI spec folder cannot be used, a forced enforcement mechanism
// is missing). It picks the node's enforcement mechanism (Config.Enforcement,
// Options.Facts, the NVIDIA toolkit's CDI specs: chooseEnforcement),
// publishes it with the inventory, records it on the Node (with why driver
// is not used or not verified) and, for mps, supervises one MPS control
// daemon per GPU. In the background it watches
// the node's pods (with Options.Client) and collects stale CDI specs.
func (p *Plugin) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("resource", p.cfg.ResourceName, "node", p.cfg.NodeName)
	ctx = klog.NewContext(ctx, logger)

	gpus, err := p.backend.GPUs()
	if err != nil {
		return fmt.Errorf("list GPUs: %w", err)
	}
	inv, err := newInventory(p.cfg, gpus)
	if err != nil {
		return err
	}
	enf, err := chooseEnforcement(logger, p.cfg, p.opts.Facts, inv.node.GPUs)
	if err != nil {
		return err
	}
	mech := enf.mech
	inv.node.Enforcement = mech
	p.inv.Store(inv)
	node, _, _ := inv.snapshot()
	unhealthy := 0
	for _, g := range node.GPUs {
		if g.Health != vgpu.Healthy {
			unhealthy++
		}
	}
	logger.Info("Advertising GPUs", "gpus", len(node.GPUs), "excluded", len(gpus)-len(node.GPUs), "unhealthy", unhealthy, "devices", len(node.GPUs)*p.cfg.SplitCount)

	if err := os.MkdirAll(p.cfg.DevicePluginDir, 0o750); err != nil {
		return fmt.Errorf("device-plugin folder: %w", err)
	}
	removeDeadSockets(logger, p.cfg.DevicePluginDir, p.socketPrefix())
	dir, err := watchDir(ctx, p.cfg.DevicePluginDir)
	if err != nil {
		return err
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	if p.opts.Client != nil {
		create := func(ctx context.Context, ev *corev1.Event) error {
			_, err := p.opts.Client.CreateEvent(ctx, ev)
			return err
		}
		w := eventqueue.New(create, corev1.EventSource{Component: eventComponent, Host: p.cfg.NodeName}, p.opts.Clock, logger.WithName("events"), eventQueueSize)
		p.events = w
		wg.Go(func() { w.Run(ctx) })
	}
	p.enforcementNodeEvent(enf)
	wg.Go(func() { p.watchHealth(ctx, inv) })
	// published is closed once the publisher has made its last write, the
	// node marked not ready, after ctx ends.
	published := make(chan struct{})
	if p.opts.Client != nil {
		pub, err := publish.New(p.opts.Client, p.publishConfig(), publishSource{p: p, inv: inv}, p.opts.Clock)
		if err != nil {
			cancel()
			return err
		}
		wg.Go(func() {
			defer close(published)
			pub.Run(ctx)
		})
	} else {
		close(published)
		logger.Info("No API server configured: inventory, heartbeat and ready label are not published")
	}

	alloc, release, err := p.startHandoff(ctx, inv)
	if err != nil {
		cancel()
		return err
	}
	alloc.enforcement, alloc.nvidiaCDI, alloc.driverUnverified = mech, enf.nvidiaCDI(), enf.unverified()
	p.alloc.Store(alloc)
	wg.Go(func() {
		<-ctx.Done()
		release()
	})
	wg.Go(func() { alloc.runGC(ctx) })
	if mech == vgpu.EnforcementMPS {
		mps := &handoff.MPSDaemons{Binary: p.opts.Facts.MPSControl, Dir: p.cfg.MPSDir, GPUs: node.GPUs, Clock: p.opts.Clock, RestartInitial: handoff.MPSRestartInitial}
		wg.Go(func() { mps.Run(ctx) })
	}

	var lastStale string
	for round := 1; ctx.Err() == nil; round++ {
		if err := p.serveRound(ctx, round, inv, alloc, dir, published, &lastStale); err != nil {
			cancel()
			return err
		}
	}
	return nil
}

// serveRound serves one endpoint: register it, wait for the kubelet to
// have its device list, call the plugin registered, then wait until the
// endpoint goes stale (kubelet restart, socket removed, stream ended,
// re-register asked) or ctx ends. When ctx ends the endpoint serves on
// until published is closed (the node marked not ready), so that the
// scheduler stops sending pods before the kubelet loses the devices.
// lastStale is why the previous registration ended ("" before the first
// one); serveRound sets it for the next round.
func (p *Plugin) serveRound(ctx context.Context, round int, inv *inventory, alloc *allocator, dir *dirWatch, published <-chan struct{}, lastStale *string) error {
	logger := klog.FromContext(ctx)
	name := p.socketName(round)
	socket := filepath.Join(p.cfg.DevicePluginDir, name)
	ep, err := startEndpoint(logger, socket, inv, alloc)
	if err != nil {
		return err
	}
	defer func() {
		if ctx.Err() != nil {
			<-published
		}
		ep.stop()
	}()

	kubelet, err := p.registerWithRetry(ctx, ep, name, dir)
	if err != nil || ctx.Err() != nil {
		return nil //nolint:nilerr // a gone socket or ctx end starts the next round or ends Run.
	}
	if reason := p.waitListed(ctx, ep, kubelet, dir); reason != "" {
		if ctx.Err() == nil {
			logger.Info("Registering again before the kubelet had the device list", "reason", reason)
		}
		return nil
	}
	p.setRegistration(registration{Registered: true, Since: p.opts.Clock.Now(), Socket: name})
	logger.Info("Registered with kubelet", "endpoint", name, "round", round)
	if *lastStale == "" {
		p.nodeEvent(corev1.EventTypeNormal, EventRegistered, "Registered %s with the kubelet (endpoint %s)", p.cfg.ResourceName, name)
	} else {
		p.nodeEvent(corev1.EventTypeNormal, EventReregistered, "Registered %s with the kubelet again (endpoint %s) after: %s", p.cfg.ResourceName, name, *lastStale)
	}

	reason := p.waitStale(ctx, ep, kubelet, dir)
	*lastStale = reason
	p.setRegistration(registration{})
	if ctx.Err() == nil {
		logger.Info("Registering again", "reason", reason)
	}
	return nil
}

// socketName is the endpoint's file name in round: the resource, this
// plugin's random instance token and the round. A name must never repeat
// across plugin restarts: a restarted plugin's container usually has the
// same PID (1), and when it registered the old plugin's socket path again
// before the kubelet had noticed the old stream end, the device manager
// refused it as "already connected", dropped both clients of that path and
// never disconnected the old endpoint, refusing every later registration of
// the path.
func (p *Plugin) socketName(round int) string {
	return fmt.Sprintf("%s%s-%d.sock", p.socketPrefix(), p.instance, round)
}

// socketPrefix is what every plugin's socket name for the resource starts with.
func (p *Plugin) socketPrefix() string {
	return "gpuslice-" + socketSafe(p.cfg.ResourceName) + "-"
}

// socketSafe turns a resource name into a file-name fragment.
func socketSafe(resource string) string {
	return strings.NewReplacer("/", "_", ".", "_").Replace(resource)
}

// watchHealth applies backend health events to the inventory until ctx ends.
func (p *Plugin) watchHealth(ctx context.Context, inv *inventory) {
	logger := klog.FromContext(ctx)
	events := make(chan vgpu.HealthEvent)
	go func() {
		if err := p.backend.WatchHealth(ctx, events); err != nil {
			logger.Error(err, "GPU health watch ended; health changes will not be seen")
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			if inv.setHealth(ev) {
				logger.Info("GPU health changed", "gpu", ev.UUID, "health", ev.Health, "reason", ev.Reason)
				p.healthEvent(inv, ev)
			}
		}
	}
}

// nodeEvent records an event on the plugin's Node, in the background; it
// does nothing without Options.Client.
func (p *Plugin) nodeEvent(eventtype, reason, messageFmt string, args ...any) {
	if p.events != nil {
		p.events.Eventf(nodeRef(p.cfg.NodeName), eventtype, reason, messageFmt, args...)
	}
}

// healthEvent records a GPU's health change on the Node, with the cause
// the backend gave (the XID and its meaning, for a device fault).
func (p *Plugin) healthEvent(inv *inventory, ev vgpu.HealthEvent) {
	model := ""
	if g, ok := inv.gpu(ev.UUID); ok {
		model = " (" + g.Model + ")"
	}
	if ev.Health == vgpu.Healthy {
		p.nodeEvent(corev1.EventTypeNormal, EventGPUHealthy, "GPU %s%s is healthy again: %s", ev.UUID, model, ev.Reason)
		return
	}
	p.nodeEvent(corev1.EventTypeWarning, EventGPUUnhealthy, "GPU %s%s is unhealthy, its slices are withdrawn: %s", ev.UUID, model, ev.Reason)
}

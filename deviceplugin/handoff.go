package deviceplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/node/handoff"
)

// eventComponent is the source of the plugin's events.
const eventComponent = "gpuslice-device-plugin"

// startHandoff prepares the folders, the PodResources client and the pod
// view, hands the allocator Run's event recorder, and returns the allocator and a function that
// releases them once ctx has ended. The pod view and the events need
// Options.Client; without it the plugin still serves and registers, but
// refuses every GPU container start (errNoPodView). Nothing here waits for
// the API server or the kubelet.
func (p *Plugin) startHandoff(ctx context.Context, inv *inventory) (*allocator, func(), error) {
	logger := klog.FromContext(ctx)
	if p.cfg.Mode == ModeCDI {
		if err := os.MkdirAll(p.cfg.CDISpecDir, 0o755); err != nil { //nolint:gosec // G301: container runtimes read CDI specs.
			return nil, nil, fmt.Errorf("CDI spec folder: %w", err)
		}
	}
	state := p.cfg.EffectiveStateDir()
	if err := os.MkdirAll(state, 0o755); err != nil { //nolint:gosec // G301: runtimes bind-mount ld.so.preload from here.
		return nil, nil, fmt.Errorf("state folder: %w", err)
	}
	if p.cfg.HostLibVGPU != "" {
		if err := handoff.EnsureFile(state, handoff.PreloadFileName, handoff.PreloadContent, 0o644); err != nil {
			return nil, nil, err
		}
	}
	claims, err := loadClaimStore(filepath.Join(state, checkpointFileName))
	if err != nil {
		logger.Error(err, "Starting without the checkpoint: containers allocated before will not restart (mode env: they cannot be verified; mode cdi: their CDI devices cannot be found)")
	}
	claims.logger = logger.WithName("checkpoint")
	podResources := newPodResourcesClient(p.cfg.PodResourcesSocket)
	a := &allocator{
		cfg:         p.cfg,
		inv:         inv,
		lister:      newCoalescingLister(podResources),
		admitLister: podResources,
		claims:      claims,
		clock:       p.opts.Clock,
		t:           defaultTimings(),
		logger:      logger.WithName("handoff"),
		metrics:     p.metrics,
	}
	stops := []func(){func() {
		a.drain()
		if err := claims.flush(); err != nil {
			logger.Error(err, "Writing the checkpoint at stop")
		}
	}}
	if p.opts.Client != nil {
		view, err := newPodView(p.opts.Client.NodePods(p.cfg.NodeName), p.cfg.NodeName)
		if err != nil {
			return nil, nil, err
		}
		view.start(ctx)
		a.pods = view
		a.live = cache.ToListerWithContext(p.opts.Client.NodePods(p.cfg.NodeName))
		a.livePod = p.opts.Client.Pod
		a.events = p.events
		stops = append(stops, view.stop)
	} else {
		logger.Info("No API server configured: GPU containers cannot get their allocation and will not start")
	}
	return a, func() {
		for _, stop := range stops {
			stop()
		}
	}, nil
}

// runGC collects stale CDI specs and claims now and every GCInterval until
// ctx ends.
func (a *allocator) runGC(ctx context.Context) {
	ticker := a.clock.NewTicker(a.t.GCInterval)
	defer ticker.Stop()
	for {
		a.gc(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}

// gc removes the CDI spec files of device IDs no container holds (a file
// of the IDs' key, or of a holder's own name as the release before wrote
// them: a previous holder's own file goes too), and the bindings and
// holdings of devices that no container holds any more, once they are
// older than
// ClaimTTL (a spec written at Allocate or PreStartContainer must outlive
// the container's creation), and
// drops old offers. Without a PodResources answer it removes nothing. It
// also restores the ld.so.preload file if someone removed it.
func (a *allocator) gc(ctx context.Context) {
	pods, err := a.lister.List(ctx)
	if err != nil {
		a.logger.V(2).Info("Stale-spec collection skipped: PodResources did not answer", "err", err.Error())
		return
	}
	live, names := map[string]bool{}, map[string]bool{}
	for _, ids := range containerDevices(pods, a.cfg.ResourceName) {
		key := handoff.DeviceName(ids)
		live[key] = true
		names[key] = true                // the IDs' spec file (specFile)
		names[a.cdiDeviceOf(ids)] = true // a holder's own file, of the release before
	}
	now := a.clock.Now()
	cutoff := now.Add(-a.t.ClaimTTL)
	removed, err := handoff.RemoveStaleSpecs(a.cfg.CDISpecDir, names, cutoff)
	if err != nil {
		a.logger.Error(err, "Removing stale CDI specs")
	}
	if len(removed) > 0 {
		a.logger.V(2).Info("Removed stale CDI specs", "devices", removed)
	}
	if dropped, err := a.claims.gc(live, cutoff, now); err != nil {
		a.logger.Error(err, "Writing the checkpoint")
	} else if dropped > 0 {
		a.logger.V(2).Info("Dropped the bindings and CDI device names of devices nobody holds", "count", dropped)
	}
	if err := handoff.RemoveStaleTemps(a.cfg.EffectiveStateDir(), cutoff); err != nil {
		a.logger.Error(err, "Removing leftover temporary files")
	}
	if a.cfg.HostLibVGPU != "" {
		if err := handoff.EnsureFile(a.cfg.EffectiveStateDir(), handoff.PreloadFileName, handoff.PreloadContent, 0o644); err != nil {
			a.logger.Error(err, "Restoring the ld.so.preload file")
		}
	}
}

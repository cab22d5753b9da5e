package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Retry timing while the kubelet is absent or refuses registration. A
// kubelet.sock creation cuts any wait short, so the back-off only matters
// when the folder gives no news.
const (
	retryInitial = 50 * time.Millisecond
	retryMax     = 5 * time.Second
	// staleCheckInterval re-checks the sockets even without folder events,
	// in case an event was lost (e.g. the folder itself was re-created).
	staleCheckInterval = 5 * time.Second
	// listTimeout bounds the wait for the kubelet's ListAndWatch after it
	// accepted Register. The kubelet opens the stream at once; one that
	// does not within this time never will (its call failed), and only a
	// new registration recovers.
	listTimeout = 10 * time.Second
)

// errSocketGone means the plugin's own socket vanished before registration
// finished; the round must start over on a fresh socket.
var errSocketGone = errors.New("plugin socket removed")

// dirWatch turns file events in the device-plugin folder into a wake-up
// signal. Consumers re-check the files themselves, so lost or merged events
// cost at most one staleCheckInterval.
type dirWatch struct {
	changed chan struct{} // buffered(1): something in the folder changed
}

func watchDir(ctx context.Context, dir string) (*dirWatch, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	if err := w.Add(dir); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	d := &dirWatch{changed: make(chan struct{}, 1)}
	logger := klog.FromContext(ctx)
	go func() {
		defer func() { _ = w.Close() }()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Op&(fsnotify.Create|fsnotify.Remove|fsnotify.Rename) != 0 {
					select {
					case d.changed <- struct{}{}:
					default:
					}
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				logger.Error(err, "Watching the device-plugin folder")
			}
		}
	}()
	return d, nil
}

// registerWithRetry registers ep until the kubelet accepts it. It waits for
// kubelet.sock to exist, backs off between failures and restarts the wait at
// once when the folder changes. It returns the kubelet.sock it registered
// with, errSocketGone if ep's socket vanished, or ctx's error.
func (p *Plugin) registerWithRetry(ctx context.Context, ep *endpoint, name string, dir *dirWatch) (os.FileInfo, error) {
	logger := klog.FromContext(ctx)
	kubeletSocket := filepath.Join(p.cfg.DevicePluginDir, kubeletSocketName)
	delay := retryInitial
	for attempt := 1; ; attempt++ {
		if _, err := os.Stat(ep.socket); err != nil {
			return nil, errSocketGone
		}
		kubelet, statErr := os.Stat(kubeletSocket)
		if statErr == nil {
			err := registerOnce(ctx, ep, kubeletSocket, name, p.cfg.ResourceName, dir)
			if err == nil || ctx.Err() == nil {
				p.metrics.registration(err)
			}
			switch {
			case err == nil:
				return kubelet, nil
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case errors.Is(err, errSocketGone):
				return nil, err
			}
			logger.Info("Registration failed; retrying", "attempt", attempt, "retryIn", delay, "err", err.Error())
			p.setProblem(vgpu.ReasonRegisterFailed, "the kubelet did not accept the registration: "+err.Error())
		} else {
			if attempt == 1 || attempt%20 == 0 {
				logger.Info("Waiting for the kubelet", "socket", kubeletSocket, "attempt", attempt)
			}
			p.setProblem(vgpu.ReasonKubeletSocketMissing, fmt.Sprintf("no %s in %s: the kubelet is not running, or the plugin watches another folder than the kubelet's device-plugin folder (devicePluginDir)",
				kubeletSocketName, p.cfg.DevicePluginDir))
		}
		timer := p.opts.Clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-dir.changed:
			delay = retryInitial
		case <-timer.C():
			delay = min(2*delay, retryMax)
		}
		timer.Stop()
	}
}

// registerOnce makes one Register call, cut short if ep's socket vanishes
// meanwhile: a kubelet that starts while the plugin registers deletes every
// socket in the folder, and the kubelet's dial-back would then wait its full
// 10 s for a socket that is gone.
func registerOnce(ctx context.Context, ep *endpoint, kubeletSocket, name, resource string, dir *dirWatch) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	result := make(chan error, 1)
	go func() { result <- Register(ctx, kubeletSocket, name, resource, pluginOptions()) }()
	for {
		select {
		case err := <-result:
			return err
		case <-dir.changed:
			if _, err := os.Stat(ep.socket); err != nil {
				cancel()
				err := <-result
				klog.FromContext(ctx).V(4).Info("Registration cut short: plugin socket removed", "err", err)
				return errSocketGone
			}
		}
	}
}

// waitListed blocks until the kubelet that accepted ep's registration has
// received ep's first device list and returns "", or returns why the
// round is over first (see waitStale), or that the kubelet did not open
// ListAndWatch within listTimeout. Between Register and that first list
// the kubelet has no devices for the resource (none at all after a
// kubelet restart), so a pod it admits then fails with
// UnexpectedAdmissionError: the plugin does not call itself registered
// before.
func (p *Plugin) waitListed(ctx context.Context, ep *endpoint, kubelet os.FileInfo, dir *dirWatch) string {
	timer := p.opts.Clock.NewTimer(listTimeout)
	defer timer.Stop()
	return p.watchRound(ctx, ep, kubelet, dir, ep.listed, timer.C())
}

// waitStale blocks until the registration of ep is no longer valid and says
// why, or until ctx ends.
func (p *Plugin) waitStale(ctx context.Context, ep *endpoint, kubelet os.FileInfo, dir *dirWatch) string {
	return p.watchRound(ctx, ep, kubelet, dir, nil, nil)
}

// watchRound blocks until ep's round is over and says why: a socket
// removed or re-created, ctx ended, a re-registration asked, the stream
// ended or the server stopped. It returns "" when done closes first, and
// a timeout's reason when deadline fires first; nil channels never do.
func (p *Plugin) watchRound(ctx context.Context, ep *endpoint, kubelet os.FileInfo, dir *dirWatch, done <-chan struct{}, deadline <-chan time.Time) string {
	kubeletSocket := filepath.Join(p.cfg.DevicePluginDir, kubeletSocketName)
	ticker := p.opts.Clock.NewTicker(staleCheckInterval)
	defer ticker.Stop()
	for {
		if _, err := os.Stat(ep.socket); err != nil {
			return "plugin socket removed"
		}
		now, err := os.Stat(kubeletSocket)
		if err != nil {
			return "kubelet.sock removed"
		}
		if !os.SameFile(kubelet, now) {
			return "kubelet.sock re-created (kubelet restarted)"
		}
		select {
		case <-ctx.Done():
			return "stopping"
		case <-p.reregister:
			return "re-registration requested"
		case <-ep.streamEnded:
			return "kubelet ended ListAndWatch"
		case <-ep.served:
			return "gRPC server stopped"
		case <-done:
			return ""
		case <-deadline:
			return fmt.Sprintf("the kubelet did not open ListAndWatch within %v of accepting the registration", listTimeout)
		case <-dir.changed:
		case <-ticker.C():
		}
	}
}

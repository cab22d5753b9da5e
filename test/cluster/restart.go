package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
)

// Names of the control-plane processes that Restart takes besides ExtenderName and WebhookName
// (KubeSchedulerName and ExtenderName are the first scheduler pair's).
const (
	APIServerName     = "kube-apiserver"
	KubeSchedulerName = "kube-scheduler"
)

// Restart ends the control-plane process name (APIServerName, WebhookName, or the KubeScheduler or
// Extender of one of Schedulers: KubeSchedulerName and ExtenderName for the first) — with SIGKILL
// when kill, as a crash would, else SIGTERM then SIGKILL after a grace period — starts it again
// with the same program, flags, environment and ports, and waits until it is ready as Start does:
// the API server's /readyz, kube-scheduler's /healthz, the extender's /readyz (informers synced),
// the webhook's /readyz and the API server calling it. It must not run concurrently with another
// start of the same process. Not for a chart cluster.
func (c *Cluster) Restart(ctx context.Context, name string, kill bool) error {
	if err := c.End(name, kill); err != nil {
		return err
	}
	return c.StartAgain(ctx, name)
}

// End ends the control-plane process name as Restart does, and leaves it stopped until
// StartAgain.
func (c *Cluster) End(name string, kill bool) error {
	if _, err := c.readiness(name); err != nil {
		return err
	}
	p := c.process(name)
	if p == nil {
		return fmt.Errorf("end %s: not running", name)
	}
	end := p.Stop
	if kill {
		end = p.Kill
	}
	if err := end(); err != nil {
		return fmt.Errorf("end %s: %w", name, err)
	}
	return nil
}

// StartAgain starts the control-plane process name, which has ended (End, or a crash), with the
// same program, flags, environment and ports, and waits until it is ready as Restart does.
func (c *Cluster) StartAgain(ctx context.Context, name string) error {
	ready, err := c.readiness(name)
	if err != nil {
		return err
	}
	p := c.process(name)
	if p == nil {
		return fmt.Errorf("start %s again: never started", name)
	}
	if !p.Exited() {
		return fmt.Errorf("start %s again: pid %d still runs", name, p.PID)
	}
	np, err := c.startEnv(name, p.Path, p.Args, p.Env, filepath.Dir(p.Log))
	if err != nil {
		return fmt.Errorf("start %s again: %w", name, err)
	}
	return ready(ctx, np)
}

// readiness returns the wait for the process name to be ready after a restart.
func (c *Cluster) readiness(name string) (func(ctx context.Context, p *Process) error, error) {
	if c.chart != nil {
		return nil, fmt.Errorf("restart %s: not supported on a cluster installed from the chart", name)
	}
	switch name {
	case APIServerName:
		return c.waitAPIServerReady, nil
	case WebhookName:
		return func(ctx context.Context, p *Process) error {
			if err := c.waitWebhookReady(ctx, p, "gpuslice webhook /readyz after restart"); err != nil {
				return err
			}
			return c.waitWebhookCalled(ctx, p, "API server calling the gpuslice webhook after restart")
		}, nil
	}
	pair, isExtender, ok := c.pairOf(name)
	switch {
	case !ok:
		return nil, fmt.Errorf("restart %q: want one of %s, %s, or a scheduler pair's kube-scheduler or extender (%s, %s, ...)", name, APIServerName, WebhookName, KubeSchedulerName, ExtenderName)
	case isExtender:
		return func(ctx context.Context, p *Process) error {
			return c.waitExtenderReady(ctx, p, pair.ExtenderURL(), name+" /readyz after restart")
		}, nil
	}
	return func(ctx context.Context, p *Process) error {
		return c.waitKubeSchedulerReady(ctx, p, name+" /healthz after restart")
	}, nil
}

// waitAPIServerReady waits until the API server process p answers /readyz.
func (c *Cluster) waitAPIServerReady(ctx context.Context, p *Process) error {
	return c.waitFor(ctx, "kube-apiserver /readyz after restart", []*Process{p}, func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil, nil
	})
}

// waitKubeSchedulerReady waits until the kube-scheduler process p answers /healthz on the port of
// its --secure-port flag.
func (c *Cluster) waitKubeSchedulerReady(ctx context.Context, p *Process, what string) error {
	port := ""
	for _, a := range p.Args {
		if v, ok := strings.CutPrefix(a, "--secure-port="); ok {
			port = v
		}
	}
	if port == "" {
		return fmt.Errorf("kube-scheduler was started without --secure-port: %v", p.Args)
	}
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed loopback health probe
	url := "https://127.0.0.1:" + port + "/healthz"
	return c.waitFor(ctx, what, []*Process{p}, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, insecure, url), nil
	})
}

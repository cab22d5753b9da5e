package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
)

// Names of the control-plane processes that Restart takes besides ExtenderName and WebhookName.
const (
	APIServerName     = "kube-apiserver"
	KubeSchedulerName = "kube-scheduler"
)

// Restart ends the control-plane process name (APIServerName, KubeSchedulerName, ExtenderName or
// WebhookName) — with SIGKILL when kill, as a crash would, else SIGTERM then SIGKILL after a
// grace period — starts it again with the same program, flags, environment and ports, and waits
// until it is ready as Start does: the API server's /readyz, kube-scheduler's /healthz, the
// extender's /readyz (informers synced), the webhook's /readyz and the API server calling it.
// It must not run concurrently with another start of the same process. Not for a chart cluster.
func (c *Cluster) Restart(ctx context.Context, name string, kill bool) error {
	if c.chart != nil {
		return fmt.Errorf("restart %s: not supported on a cluster installed from the chart", name)
	}
	var ready func(ctx context.Context, p *Process) error
	switch name {
	case APIServerName:
		ready = c.waitAPIServerReady
	case KubeSchedulerName:
		ready = func(ctx context.Context, p *Process) error {
			return c.waitKubeSchedulerReady(ctx, p, "kube-scheduler /healthz after restart")
		}
	case ExtenderName:
		ready = func(ctx context.Context, p *Process) error {
			return c.waitExtenderReady(ctx, p, "gpuslice extender /readyz after restart")
		}
	case WebhookName:
		ready = func(ctx context.Context, p *Process) error {
			if err := c.waitWebhookReady(ctx, p, "gpuslice webhook /readyz after restart"); err != nil {
				return err
			}
			return c.waitWebhookCalled(ctx, p, "API server calling the gpuslice webhook after restart")
		}
	default:
		return fmt.Errorf("restart %q: want one of %s, %s, %s, %s", name, APIServerName, KubeSchedulerName, ExtenderName, WebhookName)
	}
	p := c.process(name)
	if p == nil {
		return fmt.Errorf("restart %s: not running", name)
	}
	end := p.Stop
	if kill {
		end = p.Kill
	}
	if err := end(); err != nil {
		return fmt.Errorf("restart %s: %w", name, err)
	}
	np, err := c.startEnv(name, p.Path, p.Args, p.Env, filepath.Dir(p.Log))
	if err != nil {
		return fmt.Errorf("restart %s: %w", name, err)
	}
	return ready(ctx, np)
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

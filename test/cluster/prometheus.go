package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"

	"github.com/gpuslice/gpuslice/test/monitoring"
)

// PrometheusName is the Prometheus process's name (Process, LogTails).
const PrometheusName = "prometheus"

// PrometheusOptions has Start run a Prometheus (make prometheus installs it) that scrapes the
// cluster's extenders, webhook and device plugins as the chart's ServiceMonitors say, with the
// chart's alerting rules loaded (monitoring.Chart.Config). Every device plugin then serves its
// metrics on a loopback port of its own (NodeState.PluginHealthPort), unless its PluginArgs name
// a --health-address, which is then scraped. Only the nodes of Options.Nodes are scraped; not
// with Options.Chart or Options.Runtime.
type PrometheusOptions struct {
	// Install is where Prometheus is; empty Dir means monitoring.FindInstall.
	Install monitoring.Install
	// ChartDir is the chart whose ServiceMonitors, rules and dashboard are rendered; required.
	ChartDir string
	// ScrapeInterval replaces the ServiceMonitors' interval (the chart's 30s) and is the rules'
	// evaluation interval; zero keeps the chart's.
	ScrapeInterval time.Duration
}

// prometheusRelease is the release name and namespace the chart is rendered as for Prometheus:
// the chart's defaults, whose names the scrape jobs and the Service labels then carry.
const (
	prometheusRelease   = "gpuslice"
	prometheusNamespace = "gpuslice-system"
)

// PrometheusURL returns the base URL of the cluster's Prometheus, empty when none runs.
func (c *Cluster) PrometheusURL() string {
	if c.State.PrometheusPort == 0 {
		return ""
	}
	return "http://127.0.0.1:" + strconv.Itoa(c.State.PrometheusPort)
}

// Monitoring returns the chart's monitoring that the cluster's Prometheus runs with (its
// ServiceMonitors, rules and dashboard), nil when none runs.
func (c *Cluster) Monitoring() *monitoring.Chart { return c.monitoring }

// renderMonitoring renders the chart with its ServiceMonitors, PrometheusRule and dashboard on,
// for the cluster's Kubernetes version. The webhook's certificate is left to cert-manager: the
// render reads no cluster, and the certificate takes no part in the monitoring.
func (c *Cluster) renderMonitoring(ctx context.Context, chartDir string) (*monitoring.Chart, error) {
	version, err := c.client.Discovery().ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("helm template (monitoring): the API server's version: %w", err)
	}
	cmd := c.helmCommand(ctx, "template", prometheusRelease, chartDir,
		"--namespace", prometheusNamespace, "--kube-version", version.GitVersion, "--set", "webhook.certManager.enabled=true",
		"--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm template (monitoring): %w\n%s", err, stderr.String())
	}
	return monitoring.Parse(stdout.Bytes())
}

// monitoredPods returns the cluster's components as the pods the chart's metrics Services
// select: every scheduler pair's extender, the webhook, and every device plugin with a health
// port, named as the chart's workloads would be.
func (c *Cluster) monitoredPods() []monitoring.Pod {
	var pods []monitoring.Pod
	for i, p := range c.Schedulers() {
		pods = append(pods, monitoring.Pod{Component: "scheduler", Name: fmt.Sprintf("gpuslice-scheduler-%d", i), Address: "127.0.0.1:" + strconv.Itoa(p.ExtenderPort)})
	}
	pods = append(pods, monitoring.Pod{Component: "webhook", Name: "gpuslice-webhook-0", Address: "127.0.0.1:" + strconv.Itoa(c.State.WebhookPort)})
	for _, n := range c.Nodes {
		if n.DRA || n.PluginHealthPort == 0 {
			continue
		}
		pods = append(pods, monitoring.Pod{Component: "device-plugin", Name: "gpuslice-device-plugin-" + n.Name, Node: n.Name, Address: "127.0.0.1:" + strconv.Itoa(n.PluginHealthPort)})
	}
	return pods
}

// startPrometheus renders the chart's monitoring, writes the Prometheus configuration and rule
// file under the cluster's folder, starts Prometheus on a free loopback port and waits until it
// is ready and has scraped every target once.
func (c *Cluster) startPrometheus(ctx context.Context, opts PrometheusOptions) error {
	if opts.ChartDir == "" {
		return errors.New("prometheus: PrometheusOptions.ChartDir is required")
	}
	install := opts.Install
	if install.Dir == "" {
		var err error
		if install, err = monitoring.FindInstall(); err != nil {
			return err
		}
	}
	m, err := c.renderMonitoring(ctx, opts.ChartDir)
	if err != nil {
		return err
	}
	dir := filepath.Join(c.State.Dir, PrometheusName)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o750); err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}
	rules, err := m.RuleFile()
	if err != nil {
		return err
	}
	rulesPath := filepath.Join(dir, "gpuslice-rules.yaml")
	if err := os.WriteFile(rulesPath, rules, 0o600); err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}
	pods := c.monitoredPods()
	cfg, err := m.Config(pods, monitoring.ConfigOptions{ScrapeInterval: opts.ScrapeInterval, RuleFiles: []string{rulesPath}})
	if err != nil {
		return err
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	p, err := c.start(PrometheusName, install.Prometheus(), []string{
		"--config.file=" + cfgPath,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:" + strconv.Itoa(port),
		"--web.local-assets=" + install.WebAssets(),
		"--log.level=warn",
	}, dir)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.State.PrometheusPort = port
	err = c.saveStateLocked()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	c.monitoring = m
	url := c.PrometheusURL()
	if err := c.waitFor(ctx, "prometheus /-/ready", []*Process{p}, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, http.DefaultClient, url+"/-/ready"), nil
	}); err != nil {
		return err
	}
	return c.waitFor(ctx, fmt.Sprintf("prometheus scraping its %d targets", len(pods)), []*Process{p}, func(ctx context.Context) (bool, error) {
		up, err := prometheusTargetsUp(ctx, url)
		return err == nil && up == len(pods), nil
	})
}

// prometheusTargetsUp returns how many of the active targets of the Prometheus at url were up at
// their last scrape.
func prometheusTargetsUp(ctx context.Context, url string) (int, error) {
	client, err := promapi.NewClient(promapi.Config{Address: url})
	if err != nil {
		return 0, fmt.Errorf("prometheus client: %w", err)
	}
	targets, err := promv1.NewAPI(client).Targets(ctx)
	if err != nil {
		return 0, fmt.Errorf("prometheus targets: %w", err)
	}
	up := 0
	for _, t := range targets.Active {
		if t.Health == promv1.HealthGood {
			up++
		}
	}
	return up, nil
}

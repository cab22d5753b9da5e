package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/yaml"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/webhook"
)

// Names of the gpuslice control-plane parts the cluster runs.
const (
	// SchedulerName is the kube-scheduler profile that calls the gpuslice extender; the webhook
	// steers GPU pods to it.
	SchedulerName = "gpuslice-scheduler"
	// WebhookConfigName is the MutatingWebhookConfiguration the cluster creates.
	WebhookConfigName = "gpuslice-webhook"
	// ExtenderName and WebhookName are the process names of the extender and the webhook.
	ExtenderName = "gpuslice-scheduler"
	WebhookName  = "gpuslice-webhook"
	// DRAScoreWeight is the weight of the DRA scoring extender entry (Options.DRAScore), the
	// chart's default scheduler.extender.draWeight.
	DRAScoreWeight = 20
)

// The extender manages every vgpu.Resources() name, all ignored by the scheduler's own resource
// fit: gpumem, gpumem-percentage and gpucores exist only for the extender (FIELD.md §2), and
// hami.io/gpu is judged by the extender too, which checks the same allocatable and also says why a
// node cannot take the pod ("plugin not ready: ...") instead of "Insufficient hami.io/gpu".

// schedulerConfig renders the KubeSchedulerConfiguration: the stock profile, the gpuslice profile,
// and the extender (shared by both, as extenders are; managedResources keeps non-GPU pods away).
// What the chart sets is set as its defaults do, so that the cluster schedules like an install:
// the client's qps and burst (the chart's scheduler.kubeScheduler.clientQPS/clientBurst, equal to
// the extender's default kubeAPIQPS/kubeAPIBurst, which the extender here runs with), the
// gpuslice profile's percentageOfNodesToScore and MostAllocated scoring (scoringStrategy auto
// under the default binpack policy), and no prioritizeVerb (the extender's default
// filterResult best passes only the best-scoring nodes); the stock profile keeps
// kube-scheduler's defaults. With draScore, a second extender entry, as the chart's with
// dra.enabled: prioritizeVerb dra/prioritize at the chart's default weight, no managedResources
// (asked about every pod of both profiles here; it scores only pods with gpuslice claims),
// ignorable. With leader, kube-scheduler runs leader election on LeaderLeaseNamespace/LeaderLeaseName
// with those durations, as the chart's replicas do.
func schedulerConfig(kubeconfig string, extenderPort int, draScore bool, leader *LeaderElection) string {
	election := "  leaderElect: false\n"
	if leader != nil {
		election = fmt.Sprintf("  leaderElect: true\n  resourceNamespace: %s\n  resourceName: %s\n  leaseDuration: %s\n  renewDeadline: %s\n  retryPeriod: %s\n",
			LeaderLeaseNamespace, LeaderLeaseName, leader.LeaseDuration, leader.RenewDeadline, leader.RetryPeriod)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
  qps: 100
  burst: 200
leaderElection:
%sprofiles:
- schedulerName: default-scheduler
- schedulerName: %s
  percentageOfNodesToScore: 0
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources:
        - name: cpu
          weight: 1
        - name: memory
          weight: 1
extenders:
- urlPrefix: http://127.0.0.1:%d
  filterVerb: filter
  bindVerb: bind
  nodeCacheCapable: true
  httpTimeout: 10s
  managedResources:
`, kubeconfig, election, SchedulerName, extenderPort)
	for _, r := range vgpu.Resources() {
		fmt.Fprintf(&b, "  - name: %s\n    ignoredByScheduler: true\n", r)
	}
	if draScore {
		fmt.Fprintf(&b, `- urlPrefix: http://127.0.0.1:%d
  prioritizeVerb: dra/prioritize
  weight: %d
  nodeCacheCapable: true
  httpTimeout: 10s
  ignorable: true
`, extenderPort, DRAScoreWeight)
	}
	return b.String()
}

// pointSchedulerConfig returns the KubeSchedulerConfiguration config with clientConnection.kubeconfig
// set to kubeconfig and every extender's urlPrefix to the extender on extenderPort (plain HTTP on
// loopback); everything else is kept as given.
func pointSchedulerConfig(config, kubeconfig string, extenderPort int) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(config), &doc); err != nil {
		return "", fmt.Errorf("scheduler configuration: %w", err)
	}
	if doc == nil {
		return "", errors.New("scheduler configuration: empty document")
	}
	cc, _ := doc["clientConnection"].(map[string]any)
	if cc == nil {
		cc = map[string]any{}
	}
	cc["kubeconfig"] = kubeconfig
	doc["clientConnection"] = cc
	extenders, _ := doc["extenders"].([]any)
	for i, e := range extenders {
		m, ok := e.(map[string]any)
		if !ok {
			return "", fmt.Errorf("scheduler configuration: extenders[%d] is a %T, want a mapping", i, e)
		}
		m["urlPrefix"] = "http://127.0.0.1:" + strconv.Itoa(extenderPort)
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", fmt.Errorf("scheduler configuration: %w", err)
	}
	return string(out), nil
}

// startExtender starts pair's gpuslice scheduler extender on a free loopback port, authenticated
// by kubeconfig and under the pair's host name, and waits for its /readyz (informers synced). It
// returns the port.
func (c *Cluster) startExtender(ctx context.Context, pair SchedulerPair, kubeconfig string, extraArgs []string) (int, error) {
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	dir := filepath.Join(c.State.Dir, pair.Extender)
	args := append([]string{
		"--address=127.0.0.1:" + strconv.Itoa(port),
		"--kubeconfig=" + kubeconfig,
		"--v=2",
	}, extraArgs...)
	bin, args, err := inHost(pair.Hostname, c.State.ExtenderPath, args)
	if err != nil {
		return 0, err
	}
	p, err := c.start(pair.Extender, bin, args, dir)
	if err != nil {
		return 0, err
	}
	pair.ExtenderPort = port
	return port, c.waitExtenderReady(ctx, p, pair.ExtenderURL(), pair.Extender+" /readyz")
}

// RestartExtender stops the extender and starts it again on the same port with the same flags,
// waiting for /readyz.
func (c *Cluster) RestartExtender(ctx context.Context) error {
	return c.Restart(ctx, ExtenderName, false)
}

// waitExtenderReady waits until the extender process p answers /readyz at url (its informers
// synced).
func (c *Cluster) waitExtenderReady(ctx context.Context, p *Process, url, what string) error {
	return c.waitFor(ctx, what, []*Process{p}, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, http.DefaultClient, url+"/readyz"), nil
	})
}

// StopWebhook stops the webhook's process (SIGTERM, then SIGKILL).
func (c *Cluster) StopWebhook() error {
	p := c.process(WebhookName)
	if p == nil {
		return errors.New("no webhook is running")
	}
	return p.Stop()
}

// StopExtender stops the extender's process (SIGTERM, then SIGKILL); kube-scheduler keeps running
// and fails every GPU pod's scheduling attempt until RestartExtender.
func (c *Cluster) StopExtender() error {
	p := c.process(ExtenderName)
	if p == nil {
		return errors.New("no extender is running")
	}
	return p.Stop()
}

// ExtenderURL returns the extender's base URL: the first scheduler pair's.
func (c *Cluster) ExtenderURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(c.State.ExtenderPort)
}

// ExtenderURLs returns the base URL of every scheduler pair's extender, pair 0 first.
func (c *Cluster) ExtenderURLs() []string {
	var urls []string
	for _, p := range c.Schedulers() {
		urls = append(urls, p.ExtenderURL())
	}
	return urls
}

// WebhookURL returns the webhook's base URL (HTTPS, serving certificate in State.WebhookCA).
func (c *Cluster) WebhookURL() string {
	return "https://127.0.0.1:" + strconv.Itoa(c.State.WebhookPort)
}

// startWebhook makes a serving certificate for 127.0.0.1, starts the gpuslice webhook with it,
// waits for its /readyz, registers it with a MutatingWebhookConfiguration and waits until the
// API server calls it.
func (c *Cluster) startWebhook(ctx context.Context, extraArgs []string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	dir := filepath.Join(c.State.Dir, WebhookName)
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return fmt.Errorf("create webhook pki folder: %w", err)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		return fmt.Errorf("webhook serving certificate: %w", err)
	}
	certFile, keyFile := filepath.Join(pki, "tls.crt"), filepath.Join(pki, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return fmt.Errorf("write webhook certificate: %w", err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("write webhook key: %w", err)
	}
	c.State.WebhookPort, c.State.WebhookCA = port, certPEM
	args := append([]string{
		"--address=127.0.0.1:" + strconv.Itoa(port),
		"--tls-cert-file=" + certFile,
		"--tls-key-file=" + keyFile,
		"--scheduler-name=" + SchedulerName,
		// Used only with --dra: the claim templates of converted pods.
		"--kubeconfig=" + c.State.Kubeconfig,
		"--v=2",
	}, extraArgs...)
	p, err := c.start(WebhookName, c.State.WebhookPath, args, dir)
	if err != nil {
		return err
	}
	if err := c.waitWebhookReady(ctx, p, "gpuslice webhook /readyz"); err != nil {
		return err
	}
	if _, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, webhookConfig(c.WebhookURL()+"/mutate", certPEM), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create MutatingWebhookConfiguration: %w", err)
	}
	return c.waitWebhookCalled(ctx, p, "API server calling the gpuslice webhook")
}

// waitWebhookReady waits until the webhook process p answers /readyz over TLS, verified with
// State.WebhookCA.
func (c *Cluster) waitWebhookReady(ctx context.Context, p *Process, what string) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.State.WebhookCA)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	return c.waitFor(ctx, what, []*Process{p}, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, client, c.WebhookURL()+"/readyz"), nil
	})
}

// waitWebhookCalled waits until the API server calls the webhook process p: the API server picks a
// new MutatingWebhookConfiguration up from its informer, and a dry-run GPU pod shows when its
// schedulerName is being rewritten.
func (c *Cluster) waitWebhookCalled(ctx context.Context, p *Process, what string) error {
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpuslice-webhook-probe", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "probe", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"hami.io/gpu": resource.MustParse("1")}},
		}}},
	}
	return c.waitFor(ctx, what, []*Process{p}, func(ctx context.Context) (bool, error) {
		got, err := c.client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, probe.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, nil //nolint:nilerr // not called yet: keep polling
		}
		return got.Spec.SchedulerName != corev1.DefaultSchedulerName, nil
	})
}

// webhookConfig is the MutatingWebhookConfiguration that sends the creations of pods outside
// kube-system that ask for hami.io resources or carry hami.io annotations to url.
func webhookConfig(url string, caBundle []byte) *admissionregistrationv1.MutatingWebhookConfiguration {
	fail := admissionregistrationv1.Fail
	// With --dra the webhook creates claim templates, never on a dry run.
	effects := admissionregistrationv1.SideEffectClassNoneOnDryRun
	timeout := int32(10)
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: WebhookConfigName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "pods.gpuslice.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caBundle},
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             &effects,
			FailurePolicy:           &fail,
			TimeoutSeconds:          &timeout,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{metav1.NamespaceSystem},
			}}},
			MatchConditions: webhook.MatchConditions(),
		}},
	}
}

// Process returns the latest process started under name (e.g. APIServerName, ExtenderName), or
// nil. Use it when no start of that process is in progress.
func (c *Cluster) Process(name string) *Process { return c.process(name) }

// CPUTimes returns the CPU time each running process has used so far, by process name
// ("kube-apiserver", "node-1/kubelet", ...); processes that have ended are left out.
func (c *Cluster) CPUTimes() map[string]time.Duration {
	c.mu.Lock()
	procs := append([]*Process(nil), c.State.Processes...)
	c.mu.Unlock()
	out := map[string]time.Duration{}
	for _, p := range procs {
		if t, err := p.CPUTime(); err == nil {
			out[p.Name] = t
		}
	}
	return out
}

// process returns the running process named name, or nil.
func (c *Cluster) process(name string) *Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.State.Processes {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// NodeInventory reads Node name and the GPU inventory its device plugin published on it.
func (c *Cluster) NodeInventory(ctx context.Context, name string) (*corev1.Node, vgpu.NodeInventory, error) {
	node, err := c.Client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, vgpu.NodeInventory{}, fmt.Errorf("get node %s: %w", name, err)
	}
	inv, err := vgpu.ParseNodeInventory(node.Annotations[vgpu.AnnotationNodeInventory])
	if err != nil {
		return nil, vgpu.NodeInventory{}, fmt.Errorf("node %s inventory: %w", name, err)
	}
	return node, inv, nil
}

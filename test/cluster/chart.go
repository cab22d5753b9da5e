package cluster

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"
)

// ChartOptions has Start install gpuslice with `helm install` into the cluster's API server and
// run every gpuslice component (and the chart's kube-scheduler) as the Deployments and DaemonSets
// the API server accepted say, so that a mismatch between chart and binaries fails.
//
// With Options.Runtime they run as pods of those templates on the nodes' containerd, from the
// chart's images; startChartPluginPod, startChartControlPlanePods and adaptPod say what is changed
// for this machine.
//
// With the fake runtime nothing runs containers, so they run as host processes with the
// templates' command, arguments, environment and configuration files. What cannot be taken from
// the chart, because all simulated nodes share one host and no kubelet runs the control-plane
// pods, is adapted, and only that: mount paths are mapped to folders of the cluster (the same
// rewrite is applied to the arguments and to the mounted configuration files), each component
// gets a kubeconfig with a token of its own ServiceAccount (so the chart's RBAC is what it runs
// with) instead of in-cluster credentials, every device plugin gets its own probe port, and
// kube-scheduler its own secure port.
type ChartOptions struct {
	// Dir is the chart's folder; required.
	Dir string
	// Release and Namespace name the Helm release; empty means "gpuslice" and "gpuslice-system".
	Release, Namespace string
	// ValuesFiles and Set are passed to helm install as -f and --set.
	ValuesFiles, Set []string
}

// chartRelease is what the cluster runs from an installed chart.
type chartRelease struct {
	opts        ChartOptions
	scheduler   *appsv1.Deployment
	webhook     *appsv1.Deployment
	daemonSets  []appsv1.DaemonSet
	configMaps  map[string]corev1.ConfigMap
	secrets     map[string]corev1.Secret
	extenderAPI int // the extender's port (scheduler.extender.port)
	webhookPort int
}

// installChart runs helm install with ports the harness chooses, then reads back what the API
// server accepted.
func (c *Cluster) installChart(ctx context.Context, opts ChartOptions) error {
	if opts.Release == "" {
		opts.Release = "gpuslice"
	}
	if opts.Namespace == "" {
		opts.Namespace = "gpuslice-system"
	}
	r := &chartRelease{opts: opts, configMaps: map[string]corev1.ConfigMap{}, secrets: map[string]corev1.Secret{}}
	var err error
	if r.extenderAPI, err = freePortPair(); err != nil {
		return err
	}
	if r.webhookPort, err = freePort(); err != nil {
		return err
	}
	args := []string{"install", opts.Release, opts.Dir, "--namespace", opts.Namespace, "--create-namespace",
		"--set", "scheduler.extender.port=" + strconv.Itoa(r.extenderAPI),
		"--set", "webhook.port=" + strconv.Itoa(r.webhookPort),
	}
	if c.State.Runtime != nil {
		// The scheduler and webhook pods run on a node's containerd (startChartControlPlanePods)
		// in the node's network: the pod network here reaches nothing and the API server cannot
		// reach it. Every node's network is this host's, where kube-scheduler's default 10259
		// may be taken (by another cluster on this machine), so it gets a free port too.
		port, err := freePort()
		for err == nil && (port == r.extenderAPI || port == r.extenderAPI+1 || port == r.webhookPort) {
			port, err = freePort()
		}
		if err != nil {
			return err
		}
		args = append(args, "--set", "scheduler.hostNetwork=true", "--set", "webhook.hostNetwork=true",
			"--set", "scheduler.kubeScheduler.securePort="+strconv.Itoa(port))
	}
	for _, f := range opts.ValuesFiles {
		args = append(args, "-f", f)
	}
	for _, s := range opts.Set {
		args = append(args, "--set", s)
	}
	if out, err := c.Helm(ctx, args...); err != nil {
		return fmt.Errorf("helm install: %w\n%s", err, out)
	}
	if err := c.readRelease(ctx, r); err != nil {
		return err
	}
	c.chart = r
	return nil
}

// Helm runs the cluster's helm binary against the cluster with args and returns its combined
// output. Helm's own folders are kept in the cluster's folder.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	out, err := c.helmCommand(ctx, args...).CombinedOutput()
	return string(out), err
}

// helmCommand is Helm's command, not yet run, for a caller that reads stdout apart from stderr.
func (c *Cluster) helmCommand(ctx context.Context, args ...string) *exec.Cmd {
	home := filepath.Join(c.State.Dir, "helm")
	cmd := exec.CommandContext(ctx, filepath.Join(c.State.BinDir, "helm"), append(args, "--kubeconfig", c.State.Kubeconfig)...) //nolint:gosec // G204: the cluster's own helm
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	return cmd
}

// readRelease lists the release's workloads, ConfigMaps and Secrets from the API server.
func (c *Cluster) readRelease(ctx context.Context, r *chartRelease) error {
	ns := r.opts.Namespace
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + r.opts.Release}
	deps, err := c.client.AppsV1().Deployments(ns).List(ctx, sel)
	if err != nil {
		return fmt.Errorf("list the release's Deployments: %w", err)
	}
	for i := range deps.Items {
		d := &deps.Items[i]
		switch d.Labels["app.kubernetes.io/component"] {
		case "scheduler":
			r.scheduler = d
		case "webhook":
			r.webhook = d
		}
	}
	dss, err := c.client.AppsV1().DaemonSets(ns).List(ctx, sel)
	if err != nil {
		return fmt.Errorf("list the release's DaemonSets: %w", err)
	}
	r.daemonSets = dss.Items
	cms, err := c.client.CoreV1().ConfigMaps(ns).List(ctx, sel)
	if err != nil {
		return fmt.Errorf("list the release's ConfigMaps: %w", err)
	}
	for _, cm := range cms.Items {
		r.configMaps[cm.Name] = cm
	}
	secrets, err := c.client.CoreV1().Secrets(ns).List(ctx, sel)
	if err != nil {
		return fmt.Errorf("list the release's Secrets: %w", err)
	}
	for _, s := range secrets.Items {
		r.secrets[s.Name] = s
	}
	if r.scheduler == nil || r.webhook == nil || len(r.daemonSets) == 0 {
		return fmt.Errorf("release %s/%s: want a scheduler and a webhook Deployment and a device-plugin DaemonSet, got scheduler %t, webhook %t, %d DaemonSets",
			ns, r.opts.Release, r.scheduler != nil, r.webhook != nil, len(r.daemonSets))
	}
	return nil
}

// freePortPair returns a port p such that p and p+1 were free a moment ago (the extender's API
// port and its health port).
func freePortPair() (int, error) {
	for range 20 {
		p, err := freePort()
		if err != nil {
			return 0, err
		}
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1)); err == nil {
			_ = ln.Close()
			return p, nil
		}
	}
	return 0, fmt.Errorf("no two adjacent free ports found")
}

// podProcess is one container of a pod template turned into a process.
type podProcess struct {
	path string
	args []string
	env  []string
}

// mapping is a container path and the folder that stands for it.
type mapping struct{ container, local string }

// materialize turns container name of spec into a process: mounted ConfigMaps and Secrets are
// written under root, hostPath volumes go through hostPath, and every mount path in the arguments
// and in the mounted files is replaced by its folder. node fills spec.nodeName field references.
func (c *Cluster) materialize(r *chartRelease, spec corev1.PodSpec, name, root, node string, hostPath func(string) (string, error)) (podProcess, error) {
	var ctr *corev1.Container
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			ctr = &spec.Containers[i]
		}
	}
	if ctr == nil || len(ctr.Command) == 0 {
		return podProcess{}, fmt.Errorf("container %q with a command not found in the pod template", name)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	var maps []mapping
	var files []string // written files, rewritten once every mapping is known
	for _, m := range ctr.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			return podProcess{}, fmt.Errorf("container %s mounts unknown volume %s", name, m.Name)
		}
		local := filepath.Join(root, name, m.Name)
		var data map[string][]byte
		switch {
		case v.ConfigMap != nil:
			cm, ok := r.configMaps[v.ConfigMap.Name]
			if !ok {
				return podProcess{}, fmt.Errorf("volume %s: ConfigMap %s not in the release", m.Name, v.ConfigMap.Name)
			}
			data = map[string][]byte{}
			for k, s := range cm.Data {
				data[k] = []byte(s)
			}
		case v.Secret != nil:
			s, ok := r.secrets[v.Secret.SecretName]
			if !ok {
				return podProcess{}, fmt.Errorf("volume %s: Secret %s not in the release", m.Name, v.Secret.SecretName)
			}
			data = s.Data
		case v.HostPath != nil:
			var err error
			if local, err = hostPath(v.HostPath.Path); err != nil {
				return podProcess{}, fmt.Errorf("volume %s: %w", m.Name, err)
			}
		default:
			return podProcess{}, fmt.Errorf("volume %s: only ConfigMap, Secret and hostPath volumes are simulated", m.Name)
		}
		if err := os.MkdirAll(local, 0o750); err != nil {
			return podProcess{}, fmt.Errorf("volume %s: %w", m.Name, err)
		}
		for k, b := range data {
			f := filepath.Join(local, k)
			if err := os.WriteFile(f, b, 0o600); err != nil {
				return podProcess{}, fmt.Errorf("volume %s: %w", m.Name, err)
			}
			if v.ConfigMap != nil {
				files = append(files, f)
			}
		}
		maps = append(maps, mapping{container: m.MountPath, local: local})
	}
	rewrite := pathRewriter(maps)
	for _, f := range files {
		b, err := os.ReadFile(f) //nolint:gosec // G304: a file this function wrote
		if err != nil {
			return podProcess{}, err
		}
		if err := os.WriteFile(f, []byte(rewrite(string(b))), 0o600); err != nil {
			return podProcess{}, err
		}
	}
	p := podProcess{path: c.binaryFor(ctr.Command[0])}
	for _, a := range append(append([]string(nil), ctr.Command[1:]...), ctr.Args...) {
		p.args = append(p.args, rewrite(a))
	}
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom == nil:
			p.env = append(p.env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			p.env = append(p.env, e.Name+"="+node)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			p.env = append(p.env, e.Name+"="+r.opts.Namespace)
		default:
			return podProcess{}, fmt.Errorf("container %s: env %s: only values and spec.nodeName/metadata.namespace references are simulated", name, e.Name)
		}
	}
	return p, nil
}

// binaryFor returns the binary that runs a container's command: gpuslice's own are the ones
// Options named (PluginPath, ExtenderPath, WebhookPath; the caller's fresh build), any other is
// taken from BinDir by its base name.
func (c *Cluster) binaryFor(command string) string {
	switch base := filepath.Base(command); base {
	case "gpuslice-device-plugin":
		return c.State.PluginPath
	case ExtenderName:
		return c.State.ExtenderPath
	case WebhookName:
		return c.State.WebhookPath
	default:
		return filepath.Join(c.State.BinDir, base)
	}
}

// pathRewriter returns a function that replaces every container path of maps (longest first, and
// only as a whole path element) by its folder.
func pathRewriter(maps []mapping) func(string) string {
	if len(maps) == 0 {
		return func(s string) string { return s }
	}
	sorted := append([]mapping(nil), maps...)
	sort.Slice(sorted, func(i, j int) bool { return len(sorted[i].container) > len(sorted[j].container) })
	local := map[string]string{}
	var alts []string
	for _, m := range sorted {
		local[m.container] = m.local
		alts = append(alts, regexp.QuoteMeta(m.container))
	}
	re := regexp.MustCompile(`(` + strings.Join(alts, "|") + `)(/|$|["'\s,;:])`)
	return func(s string) string {
		return re.ReplaceAllStringFunc(s, func(m string) string {
			sub := re.FindStringSubmatch(m)
			return local[sub[1]] + sub[2]
		})
	}
}

// serviceAccountKubeconfig writes a kubeconfig for ServiceAccount sa of the release namespace,
// with a token from the TokenRequest API, to path.
func (c *Cluster) serviceAccountKubeconfig(ctx context.Context, ns, sa, path string) error {
	return c.tokenKubeconfig(ctx, ns, sa, nil, path)
}

// podBoundKubeconfig writes a kubeconfig for ServiceAccount sa of namespace ns whose token is
// bound to a pod on node, as a DaemonSet pod's projected token is: such a token carries the
// node-name claim the chart's node policy checks. Without a DaemonSet controller there is no
// such pod, so a pause pod named name stands in for it on that node (it runs there like any pod),
// with labels (the DaemonSet's pod labels), so that it is the plugin's pod to whoever looks.
func (c *Cluster) podBoundKubeconfig(ctx context.Context, ns, sa, node, name string, labels map[string]string, path string) error {
	all := map[string]string{"gpuslice.io/token-holder": "true"}
	maps.Copy(all, labels)
	pod, err := c.client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: all},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa, NodeName: node, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("pod holding the token of %s/%s on node %s: %w", ns, sa, node, err)
	}
	return c.tokenKubeconfig(ctx, ns, sa, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}, path)
}

// tokenKubeconfig writes a kubeconfig for ServiceAccount sa of namespace ns, with a token from
// the TokenRequest API bound to bound (nil: to nothing), to path.
func (c *Cluster) tokenKubeconfig(ctx context.Context, ns, sa string, bound *authenticationv1.BoundObjectReference, path string) error {
	expiry := int64(24 * 3600)
	tok, err := c.client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry, BoundObjectRef: bound},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for ServiceAccount %s/%s: %w", ns, sa, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: c.RESTConfig().Host, CertificateAuthorityData: c.State.CAData}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig for %s: %w", sa, err)
	}
	return nil
}

// daemonSetFor returns the release's device-plugin DaemonSet whose node selector and required node
// affinity match a Node with labels (using the scheduler's own matching code), or an error when
// none or several do.
func (r *chartRelease) daemonSetFor(nodeName string, labels map[string]string) (*appsv1.DaemonSet, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: labels}}
	var found []*appsv1.DaemonSet
	for i := range r.daemonSets {
		ds := &r.daemonSets[i]
		pod := &corev1.Pod{Spec: ds.Spec.Template.Spec}
		if ok, _ := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); ok {
			found = append(found, ds)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("no device-plugin DaemonSet of the release selects node %s (labels %v)", nodeName, labels)
	case 1:
		return found[0], nil
	default:
		return nil, fmt.Errorf("%d device-plugin DaemonSets select node %s: the chart must keep them apart", len(found), nodeName)
	}
}

// editSchedulerConfig sets clientConnection.kubeconfig in the KubeSchedulerConfiguration file at
// path: with --config, kube-scheduler takes its credentials only from there.
func editSchedulerConfig(path, kubeconfig string) error {
	b, err := os.ReadFile(path) //nolint:gosec // G304: the file materialize wrote
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("scheduler configuration %s: %w", path, err)
	}
	cc, _ := doc["clientConnection"].(map[string]any)
	if cc == nil {
		cc = map[string]any{}
	}
	cc["kubeconfig"] = kubeconfig
	doc["clientConnection"] = cc
	out, err := yaml.Marshal(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o600)
}

// hostIPv4 returns the first IPv4 address of an up, non-loopback interface: the API server refuses
// loopback endpoints, so the webhook's EndpointSlice needs a real one.
func hostIPv4() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, i := range ifaces {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String(), nil
			}
		}
	}
	return "", fmt.Errorf("no non-loopback IPv4 address: the API server reaches the chart's webhook Service through an EndpointSlice, which may not point at loopback")
}

// startChartPlugin starts n's device plugin from the release's DaemonSet that selects n.
func (n *Node) startChartPlugin(ctx context.Context) error {
	c, r := n.c, n.c.chart
	ds, err := r.daemonSetFor(n.Name, n.Labels)
	if err != nil {
		return err
	}
	if c.State.Runtime != nil {
		return n.startChartPluginPod(ctx, ds)
	}
	spec := ds.Spec.Template.Spec
	root := filepath.Join(n.Dir, "chart")
	hostPath := func(p string) (string, error) {
		switch {
		case strings.HasPrefix(p, "/var/lib/"):
			return filepath.Join(n.Dir, "varlib", strings.TrimPrefix(p, "/var/lib/")), nil
		case p == "/var/run/cdi" || p == "/etc/cdi":
			return n.CDISpecDir(), nil
		case strings.HasPrefix(p, "/run/"):
			return filepath.Join(n.Dir, "run", strings.TrimPrefix(p, "/run/")), nil
		case p == "/proc":
			return p, nil // the plugin runs on this host: its /proc is the host's
		}
		return "", fmt.Errorf("hostPath %s: not simulated (only /var/lib/..., /run/..., the CDI folder and /proc)", p)
	}
	pp, err := c.materialize(r, spec, "device-plugin", root, n.Name, hostPath)
	if err != nil {
		return fmt.Errorf("DaemonSet %s: %w", ds.Name, err)
	}
	kc := filepath.Join(root, "kubeconfig")
	if err := c.podBoundKubeconfig(ctx, r.opts.Namespace, spec.ServiceAccountName, n.Name, ds.Name+"-"+n.Name, ds.Spec.Template.Labels, kc); err != nil {
		return err
	}
	health, err := freePort()
	if err != nil {
		return err
	}
	n.PluginDaemonSet = ds.Name
	n.PluginHealthPort = health
	args := append(pp.args, "--kubeconfig="+kc, "--health-address=127.0.0.1:"+strconv.Itoa(health))
	args = append(args, n.PluginArgs...)
	p, err := c.startEnv(n.Name+"/device-plugin", pp.path, args, pp.env, n.Dir)
	if err != nil {
		return err
	}
	n.Plugin = p
	return nil
}

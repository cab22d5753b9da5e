package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// Names of the containers of the chart's scheduler Deployment.
const (
	extenderContainer      = "extender"
	kubeSchedulerContainer = "kube-scheduler"
)

// noHostPath refuses hostPath volumes: the control-plane pods of the chart have none.
func noHostPath(p string) (string, error) {
	return "", fmt.Errorf("hostPath %s: not expected in a control-plane pod", p)
}

// startChartControlPlane starts the extender and kube-scheduler of the chart's scheduler
// Deployment and the webhook of its webhook Deployment as host processes, makes the webhook
// Service reachable through an EndpointSlice, and waits until the API server calls the webhook.
// Used without a real runtime; see startChartControlPlanePods for the containers.
func (c *Cluster) startChartControlPlane(ctx context.Context) error {
	r := c.chart
	ns := r.opts.Namespace
	root := filepath.Join(c.State.Dir, "chart")
	spec := r.scheduler.Spec.Template.Spec
	kc := filepath.Join(root, "scheduler", "kubeconfig")
	if err := c.serviceAccountKubeconfig(ctx, ns, spec.ServiceAccountName, kc); err != nil {
		return err
	}
	ext, err := c.materialize(r, spec, extenderContainer, filepath.Join(root, "scheduler"), "", noHostPath)
	if err != nil {
		return fmt.Errorf("scheduler Deployment: %w", err)
	}
	c.State.ExtenderPath, c.State.ExtenderPort = ext.path, r.extenderAPI
	p, err := c.startEnv(ExtenderName, ext.path, append(ext.args, "--kubeconfig="+kc), ext.env, filepath.Join(c.State.Dir, ExtenderName))
	if err != nil {
		return err
	}
	pair := schedulerPair(0, 1)
	pair.ExtenderPort = r.extenderAPI
	c.mu.Lock()
	c.State.Schedulers = []SchedulerPair{pair}
	c.mu.Unlock()
	if err := c.waitExtenderReady(ctx, p, pair.ExtenderURL(), "gpuslice extender /readyz (from the chart)"); err != nil {
		return err
	}

	ks, err := c.materialize(r, spec, kubeSchedulerContainer, filepath.Join(root, "scheduler"), "", noHostPath)
	if err != nil {
		return fmt.Errorf("scheduler Deployment: %w", err)
	}
	for _, a := range ks.args {
		if f, ok := strings.CutPrefix(a, "--config="); ok {
			if err := editSchedulerConfig(f, kc); err != nil {
				return err
			}
		}
	}
	if err := c.startKubeScheduler(ctx, KubeSchedulerName, ks.path, ks.args, ks.env); err != nil {
		return err
	}

	wspec := r.webhook.Spec.Template.Spec
	wh, err := c.materialize(r, wspec, "webhook", filepath.Join(root, "webhook"), "", noHostPath)
	if err != nil {
		return fmt.Errorf("webhook Deployment: %w", err)
	}
	c.State.WebhookPath, c.State.WebhookPort = wh.path, r.webhookPort
	wp, err := c.startEnv(WebhookName, wh.path, wh.args, wh.env, filepath.Join(c.State.Dir, WebhookName))
	if err != nil {
		return err
	}
	ip, err := hostIPv4()
	if err != nil {
		return err
	}
	if err := c.exposeChartWebhook(ctx, ip, r.webhookPort, nil); err != nil {
		return err
	}
	return c.waitWebhookCalled(ctx, wp, "API server calling the chart's webhook")
}

// startChartControlPlanePods runs the chart's scheduler Deployment (kube-scheduler and the
// extender) and its webhook Deployment as the Deployment controller would, each as one pod of its
// template on the first node the template may run on, where the kubelet runs their containers
// on containerd from the chart's images. Nothing here would place them (the chart's
// kube-scheduler is one of them; no other scheduler runs), so they are bound to that node. The
// chart runs them in the node's network (scheduler.hostNetwork and webhook.hostNetwork, which
// installChart sets) on ports installChart chose; beyond the chart, only adaptPod's changes are
// made. One replica each: all nodes share this host's network, where a second replica's ports
// would be taken. It waits until every container is Ready (the kubelet's probes), the plugin
// pods' included (their nodes wait only for the plugins' registration), then makes the webhook
// Service reach the webhook's pod and waits until the API server calls it.
func (c *Cluster) startChartControlPlanePods(ctx context.Context) error {
	r := c.chart
	if len(c.Nodes) == 0 {
		return errors.New("chart on a real runtime: the scheduler and webhook pods need a node; start the cluster with at least one")
	}
	sched, err := c.deploymentPod(ctx, r.scheduler)
	if err != nil {
		return err
	}
	wh, err := c.deploymentPod(ctx, r.webhook)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.State.ExtenderPort, c.State.WebhookPort = r.extenderAPI, r.webhookPort
	c.State.SchedulerPod, c.State.WebhookPod = sched.Name, wh.Name
	err = c.saveStateLocked()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if _, err := c.waitPodReady(ctx, sched); err != nil {
		return err
	}
	if wh, err = c.waitPodReady(ctx, wh); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if n.PluginPod != "" {
			plugin := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: n.PluginPod, Namespace: r.opts.Namespace}, Spec: corev1.PodSpec{NodeName: n.Name}}
			if _, err := c.waitPodReady(ctx, plugin); err != nil {
				return err
			}
		}
	}
	svc, err := c.chartWebhookService(ctx)
	if err != nil {
		return err
	}
	port, err := podPort(wh, svc)
	if err != nil {
		return err
	}
	if err := c.exposeChartWebhook(ctx, wh.Status.PodIP, port, wh); err != nil {
		return err
	}
	return c.waitWebhookCalled(ctx, nil, "API server calling the chart's webhook pod "+wh.Name)
}

// deploymentPod creates the pod of Deployment d's template on the first node (in the cluster's
// order) that its node selector and required node affinity admit, named after d and the node,
// and returns it.
func (c *Cluster) deploymentPod(ctx context.Context, d *appsv1.Deployment) (*corev1.Pod, error) {
	spec := *d.Spec.Template.Spec.DeepCopy()
	affinity := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: spec})
	for _, n := range c.Nodes {
		if ok, _ := affinity.Match(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}}); ok {
			spec.NodeName = n.Name
			break
		}
	}
	if spec.NodeName == "" {
		return nil, fmt.Errorf("the pod of Deployment %s: no node of the cluster matches its node selector and affinity", d.Name)
	}
	isController := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        d.Name + "-" + spec.NodeName,
			Namespace:   d.Namespace,
			Labels:      d.Spec.Template.Labels,
			Annotations: d.Spec.Template.Annotations,
			// The Deployment stands for the ReplicaSet its controller would have made.
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: &isController,
			}},
		},
		Spec: spec,
	}
	if err := c.adaptPod(ctx, pod); err != nil {
		return nil, err
	}
	if err := c.replacePod(ctx, pod); err != nil {
		return nil, fmt.Errorf("the pod of Deployment %s on %s: %w", d.Name, spec.NodeName, err)
	}
	return pod, nil
}

// waitPodReady waits until every container of pod is Ready by the kubelet's probes and returns
// the pod as it then is. A container that exits meanwhile ends the wait with its exit (its log is
// in LogTails); so does the exit of the node's kubelet or containerd.
func (c *Cluster) waitPodReady(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	var procs []*Process
	for _, n := range c.Nodes {
		if n.Name == pod.Spec.NodeName {
			procs = append(procs, n.Kubelet, n.CRI)
		}
	}
	var got *corev1.Pod
	err := c.waitFor(ctx, "pod "+pod.Namespace+"/"+pod.Name+" Ready", procs, func(ctx context.Context) (bool, error) {
		p, err := c.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not readable yet: keep polling
		}
		for _, st := range p.Status.ContainerStatuses {
			t := st.State.Terminated
			if t == nil {
				t = st.LastTerminationState.Terminated
			}
			if t != nil {
				return false, fmt.Errorf("container %s of pod %s exited (code %d, %s: %s)", st.Name, p.Name, t.ExitCode, t.Reason, t.Message)
			}
		}
		got = p
		return podReady(p), nil
	})
	return got, err
}

// podReady reports whether p's Ready condition is True.
func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// chartWebhookService returns the release's webhook Service.
func (c *Cluster) chartWebhookService(ctx context.Context) (*corev1.Service, error) {
	r := c.chart
	svcs, err := c.client.CoreV1().Services(r.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + r.opts.Release + ",app.kubernetes.io/component=webhook"})
	if err != nil {
		return nil, fmt.Errorf("list the release's webhook Service: %w", err)
	}
	if len(svcs.Items) != 1 || len(svcs.Items[0].Spec.Ports) != 1 {
		return nil, fmt.Errorf("the release's webhook Service: %d found, want 1 with one port", len(svcs.Items))
	}
	return &svcs.Items[0], nil
}

// podPort returns the container port of pod that svc's only port targets (by name or number).
func podPort(pod *corev1.Pod, svc *corev1.Service) (int, error) {
	target := svc.Spec.Ports[0].TargetPort
	if target.StrVal == "" {
		return target.IntValue(), nil
	}
	for _, ctr := range pod.Spec.Containers {
		for _, p := range ctr.Ports {
			if p.Name == target.StrVal {
				return int(p.ContainerPort), nil
			}
		}
	}
	return 0, fmt.Errorf("webhook Service %s targets port %q, which no container of pod %s declares", svc.Name, target.StrVal, pod.Name)
}

// exposeChartWebhook creates the EndpointSlice of the chart's webhook Service: address ip, the
// webhook's port, and pod (nil for a host process) as its target, Ready. No endpoint controller
// runs here (no kube-controller-manager in chart mode); the slice is what its EndpointSlice
// controller would write for a Ready pod. The API server resolves the Service through it
// (--enable-aggregator-routing); see waitWebhookCalled.
func (c *Cluster) exposeChartWebhook(ctx context.Context, ip string, port int, pod *corev1.Pod) error {
	ns := c.chart.opts.Namespace
	svc, err := c.chartWebhookService(ctx)
	if err != nil {
		return err
	}
	portName, proto, ready := svc.Spec.Ports[0].Name, corev1.ProtocolTCP, true
	p := int32(port) //nolint:gosec // G115: a TCP port
	ep := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
	if pod != nil {
		ep.NodeName = &pod.Spec.NodeName
		ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc.Name + "-local", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{ep},
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &p, Protocol: &proto}},
	}
	if _, err := c.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the webhook's EndpointSlice: %w", err)
	}
	return nil
}

package inspect

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Labels of the chart's objects (charts/gpuslice/templates/_helpers.tpl):
// every object carries LabelPartOf=PartOf and its component's LabelComponent.
const (
	LabelPartOf    = "app.kubernetes.io/part-of"
	PartOf         = "gpuslice"
	LabelComponent = "app.kubernetes.io/component"
	// ComponentDevicePlugin, ComponentScheduler and ComponentWebhook are the
	// chart's LabelComponent values.
	ComponentDevicePlugin = "device-plugin"
	ComponentScheduler    = "scheduler"
	ComponentWebhook      = "webhook"
)

// Snapshot is what the API server held when Load read it. Lists are sorted
// by namespace and name. Status and Why need Nodes, Leases and Pods; the
// other fields are read only for Doctor (LoadOptions.Doctor) and are empty
// otherwise.
type Snapshot struct {
	// Now is when the snapshot was read; ages are measured from it.
	Now time.Time
	// HeartbeatNamespace is where the heartbeat Leases were looked for.
	HeartbeatNamespace string
	// Nodes are every Node.
	Nodes []corev1.Node
	// Leases are the heartbeat Leases by the name of the node whose
	// vgpu.HeartbeatLeaseName they carry.
	Leases map[string]coordinationv1.Lease
	// Pods are every Pod that asks for a GPU or carries an allocation,
	// and, for Doctor, the device plugin's pods.
	Pods []corev1.Pod

	// ResourceSlices are those of the gpuslice DRA driver (DRADriverName)
	// and ResourceClaims every allocated claim: the DRA-mode nodes' GPUs
	// and what pods hold on them.
	ResourceSlices []resourcev1.ResourceSlice
	ResourceClaims []resourcev1.ResourceClaim

	// DaemonSets and Deployments are the chart's (LabelPartOf=PartOf).
	DaemonSets  []appsv1.DaemonSet
	Deployments []appsv1.Deployment
	// ConfigMaps are the chart's scheduler ConfigMaps (LoadOptions.SchedulerConfig).
	ConfigMaps []corev1.ConfigMap
	// Webhooks are the chart's MutatingWebhookConfigurations, and any other
	// with a webhook named *.gpuslice.io.
	Webhooks []admissionregistrationv1.MutatingWebhookConfiguration
	// Services and EndpointSlices are those of the webhooks' Services.
	Services       []corev1.Service
	EndpointSlices []discoveryv1.EndpointSlice
	// SchedulerLeases are the leader-election Leases the scheduler
	// ConfigMaps name, by "namespace/name"; missing ones are absent.
	SchedulerLeases map[string]coordinationv1.Lease
	// DryRun is the answer to creating a GPU pod with dryRun=All, which
	// the API server passes through the mutating webhooks; nil when not
	// tried.
	DryRun *DryRun
}

// DryRun is the outcome of a dry-run pod creation.
type DryRun struct {
	// Namespace is where the pod was (not) created.
	Namespace string
	// Pod is the pod as the API server would have stored it; nil on error.
	Pod *corev1.Pod
	// Err is the API server's error, "" when it accepted the pod.
	Err string
	// Forbidden is true when Err is the caller's lack of permission to
	// create pods there: the dry run says nothing about the webhook.
	Forbidden bool `json:"forbidden,omitempty"`
}

// LoadOptions says what Load reads.
type LoadOptions struct {
	// HeartbeatNamespace is the heartbeat Leases' namespace; empty means
	// vgpu.DefaultHeartbeatNamespace.
	HeartbeatNamespace string
	// Doctor also reads the chart's objects and tries a dry-run GPU pod.
	Doctor bool
	// SchedulerConfig also reads the chart's scheduler ConfigMaps, whose
	// extender settings Why uses; Doctor implies it.
	SchedulerConfig bool
	// DryRunNamespace is where Doctor's dry-run pod goes; empty means
	// "default".
	DryRunNamespace string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Load reads a Snapshot through client. It fails on the first list the
// API server refuses, naming it.
func Load(ctx context.Context, client kubernetes.Interface, opts LoadOptions) (*Snapshot, error) {
	if opts.HeartbeatNamespace == "" {
		opts.HeartbeatNamespace = vgpu.DefaultHeartbeatNamespace
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Snapshot{Now: opts.Now(), HeartbeatNamespace: opts.HeartbeatNamespace, Leases: map[string]coordinationv1.Lease{}}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	s.Nodes = nodes.Items
	slices.SortFunc(s.Nodes, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	leases, err := client.CoordinationV1().Leases(opts.HeartbeatNamespace).List(ctx, metav1.ListOptions{LabelSelector: vgpu.LabelHeartbeat + "=" + vgpu.LabelHeartbeatValue})
	if err != nil {
		return nil, fmt.Errorf("list heartbeat leases in namespace %s: %w", opts.HeartbeatNamespace, err)
	}
	byName := map[string]coordinationv1.Lease{}
	for _, l := range leases.Items {
		byName[l.Name] = l
	}
	for _, n := range s.Nodes {
		if l, ok := byName[vgpu.HeartbeatLeaseName(n.Name)]; ok {
			s.Leases[n.Name] = l
		}
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	for _, p := range pods.Items {
		_, placed := p.Annotations[vgpu.AnnotationPodAllocation]
		if placed || vgpu.AsksForGPU(&p) || (opts.Doctor && isPluginPod(&p)) {
			s.Pods = append(s.Pods, p)
		}
	}
	slices.SortFunc(s.Pods, func(a, b corev1.Pod) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	if err := s.loadDRA(ctx, client); err != nil {
		return nil, err
	}
	if opts.Doctor || opts.SchedulerConfig {
		cms, err := client.CoreV1().ConfigMaps(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: LabelPartOf + "=" + PartOf + "," + LabelComponent + "=" + ComponentScheduler})
		if err != nil {
			return nil, fmt.Errorf("list gpuslice scheduler ConfigMaps: %w", err)
		}
		s.ConfigMaps = cms.Items
	}
	if opts.Doctor {
		if err := s.loadChart(ctx, client, opts); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// isPluginPod reports whether p is one of the chart's device-plugin pods.
func isPluginPod(p *corev1.Pod) bool {
	return p.Labels[LabelComponent] == ComponentDevicePlugin && p.Labels["app.kubernetes.io/name"] != ""
}

// loadChart reads the objects only Doctor looks at.
func (s *Snapshot) loadChart(ctx context.Context, client kubernetes.Interface, opts LoadOptions) error {
	chart := metav1.ListOptions{LabelSelector: LabelPartOf + "=" + PartOf}
	ds, err := client.AppsV1().DaemonSets(metav1.NamespaceAll).List(ctx, chart)
	if err != nil {
		return fmt.Errorf("list gpuslice DaemonSets: %w", err)
	}
	s.DaemonSets = ds.Items
	deps, err := client.AppsV1().Deployments(metav1.NamespaceAll).List(ctx, chart)
	if err != nil {
		return fmt.Errorf("list gpuslice Deployments: %w", err)
	}
	s.Deployments = deps.Items
	whs, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list MutatingWebhookConfigurations: %w", err)
	}
	for _, c := range whs.Items {
		if isGPUSliceWebhook(&c) {
			s.Webhooks = append(s.Webhooks, c)
		}
	}
	for _, c := range s.Webhooks {
		for _, w := range c.Webhooks {
			ref := w.ClientConfig.Service
			if ref == nil {
				continue
			}
			svc, err := client.CoreV1().Services(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err == nil {
				s.Services = append(s.Services, *svc)
			}
			eps, err := client.DiscoveryV1().EndpointSlices(ref.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + ref.Name})
			if err != nil {
				return fmt.Errorf("list EndpointSlices of Service %s/%s: %w", ref.Namespace, ref.Name, err)
			}
			s.EndpointSlices = append(s.EndpointSlices, eps.Items...)
		}
	}
	s.SchedulerLeases = map[string]coordinationv1.Lease{}
	for i := range s.ConfigMaps {
		sc, err := parseSchedulerConfig(&s.ConfigMaps[i])
		if err != nil || sc.leaderLease == "" {
			continue
		}
		ns, name, _ := strings.Cut(sc.leaderLease, "/")
		if l, err := client.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			s.SchedulerLeases[sc.leaderLease] = *l
		}
	}
	if len(s.Webhooks) > 0 {
		s.DryRun = dryRun(ctx, client, opts.DryRunNamespace)
	}
	return nil
}

// webhookSuffix ends the name of gpuslice's webhooks ("pods.gpuslice.io").
const webhookSuffix = ".gpuslice.io"

// isGPUSliceWebhook reports whether c is the chart's, or holds a webhook
// named like gpuslice's (an installation without the chart).
func isGPUSliceWebhook(c *admissionregistrationv1.MutatingWebhookConfiguration) bool {
	if c.Labels[LabelPartOf] == PartOf {
		return true
	}
	for _, w := range c.Webhooks {
		if strings.HasSuffix(w.Name, webhookSuffix) {
			return true
		}
	}
	return false
}

// dryRunPodName names the pod doctor asks the API server to admit, never
// to store.
const dryRunPodName = "gpuslice-doctor-dry-run"

// dryRun asks the API server to create a one-slice GPU pod in namespace
// with dryRun=All: admission, the mutating webhooks included, runs and
// nothing is stored.
func dryRun(ctx context.Context, client kubernetes.Interface, namespace string) *DryRun {
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: dryRunPodName, Namespace: namespace},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "probe", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{vgpu.ResourceGPU: *resource.NewQuantity(1, resource.DecimalSI)}},
		}}},
	}
	got, err := client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return &DryRun{Namespace: namespace, Err: err.Error(), Forbidden: apierrors.IsForbidden(err)}
	}
	return &DryRun{Namespace: namespace, Pod: got}
}

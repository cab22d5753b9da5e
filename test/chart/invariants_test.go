package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/webhook"
)

// clusterScoped are the cluster-scoped kinds the chart renders.
func clusterScoped(kind string) bool {
	switch kind {
	case "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "DeviceClass":
		return true
	}
	return false
}

// foreignNamespaceReason says why an object may live outside the release namespace, or "" when
// it may not: the device plugins' heartbeat Leases live in kube-node-lease, and the role that
// reads the API server's client CA lives in kube-system.
func foreignNamespaceReason(o object) string {
	switch ns := o.u.GetNamespace(); {
	case ns == "kube-node-lease" && (o.u.GetKind() == "Role" || o.u.GetKind() == "RoleBinding"):
		return "heartbeat Leases"
	case o.u.GetKind() == "ConfigMap" && o.u.GetLabels()["app.kubernetes.io/component"] == "monitoring":
		return "the Grafana dashboard, where the Grafana sidecar reads it (grafanaDashboard.namespace)"
	case ns == "kube-system":
		if rb, ok := o.typed.(*rbacv1.RoleBinding); ok && rb.RoleRef.Kind == "Role" && rb.RoleRef.Name == "extension-apiserver-authentication-reader" {
			return "the API server's client CA"
		}
	}
	return ""
}

// checkInvariants checks what every render must satisfy, whatever the values.
func checkInvariants(t *testing.T, meta chartMeta, r rendered) {
	if len(r.objs) == 0 {
		t.Fatal("the render holds no object")
	}
	checkLabels(t, meta, r)
	checkNamespaces(t, r)
	checkWorkloads(t, r)
	checkServices(t, r)
	checkWebhookConfigurations(t, r)
	checkDisruptionBudgets(t, r)
}

// checkLabels checks that every object carries the chart's standard labels and its component.
func checkLabels(t *testing.T, meta chartMeta, r rendered) {
	want := map[string]string{
		"helm.sh/chart":                meta.Name + "-" + meta.Version,
		"app.kubernetes.io/name":       meta.Name,
		"app.kubernetes.io/instance":   releaseName,
		"app.kubernetes.io/version":    meta.AppVersion,
		"app.kubernetes.io/managed-by": "Helm",
		"app.kubernetes.io/part-of":    "gpuslice",
	}
	components := []string{"device-plugin", "dra-plugin", "scheduler", "webhook", "monitoring"}
	for _, o := range r.objs {
		got := o.u.GetLabels()
		for _, k := range sortedKeys(want) {
			if got[k] != want[k] {
				t.Errorf("%s: label %s=%q, want %q", o.ref(), k, got[k], want[k])
			}
		}
		if c := got["app.kubernetes.io/component"]; !slices.Contains(components, c) {
			t.Errorf("%s: label app.kubernetes.io/component=%q, want one of %v", o.ref(), c, components)
		}
	}
}

// checkNamespaces checks that every namespaced object is in the release namespace (or has a
// reason not to be) and that cluster-scoped objects name none.
func checkNamespaces(t *testing.T, r rendered) {
	for _, o := range r.objs {
		ns := o.u.GetNamespace()
		switch {
		case clusterScoped(o.u.GetKind()):
			if ns != "" {
				t.Errorf("%s: a cluster-scoped object with metadata.namespace %q", o.ref(), ns)
			}
		case ns == releaseNamespace:
		case foreignNamespaceReason(o) != "":
		default:
			t.Errorf("%s: namespace %q, want the release namespace %q", o.ref(), ns, releaseNamespace)
		}
	}
}

// checkWorkloads checks every Deployment and DaemonSet: the selector matches the pod labels,
// every container is bounded, probed and unprivileged, and the pod refers only to objects the
// chart renders (or cert-manager makes).
func checkWorkloads(t *testing.T, r rendered) {
	for _, w := range r.workloads() {
		sel, err := metav1.LabelSelectorAsSelector(w.selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(w.template.Labels)) {
			t.Errorf("%s: selector %v does not select the pod labels %v (err %v)", w.ref, w.selector, w.template.Labels, err)
		}
		pod := w.template.Spec
		if len(pod.Containers) == 0 {
			t.Errorf("%s: no container", w.ref)
		}
		for _, c := range pod.InitContainers {
			// The API server refuses probes on a regular init container.
			checkContainer(t, w.ref+" init container "+c.Name, c, vgpu.IsSidecar(&c))
		}
		for _, c := range pod.Containers {
			checkContainer(t, w.ref+" container "+c.Name, c, true)
		}
		if pod.HostNetwork {
			// In the node's network: cluster DNS only with ClusterFirstWithHostNet, and only
			// declared ports (host ports then) keep two replicas off one node.
			if pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
				t.Errorf("%s: hostNetwork with dnsPolicy %q, want %q", w.ref, pod.DNSPolicy, corev1.DNSClusterFirstWithHostNet)
			}
			for _, c := range pod.Containers {
				if len(c.Ports) == 0 {
					t.Errorf("%s container %s: hostNetwork, but it declares no port", w.ref, c.Name)
				}
			}
		}
		if sa := pod.ServiceAccountName; sa != "" && r.find("ServiceAccount", sa) == nil {
			t.Errorf("%s: serviceAccountName %q is not rendered", w.ref, sa)
		}
		if pod.ServiceAccountName == "" && (pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken) {
			t.Errorf("%s: runs as the namespace's default ServiceAccount with its token mounted", w.ref)
		}
		for _, v := range pod.Volumes {
			switch {
			case v.ConfigMap != nil && r.find("ConfigMap", v.ConfigMap.Name) == nil:
				t.Errorf("%s: volume %s: ConfigMap %q is not rendered", w.ref, v.Name, v.ConfigMap.Name)
			case v.Secret != nil && !secretProvided(r, v.Secret.SecretName):
				t.Errorf("%s: volume %s: Secret %q is neither rendered nor a cert-manager Certificate's", w.ref, v.Name, v.Secret.SecretName)
			}
		}
	}
}

// secretProvided reports whether the render holds Secret name or a Certificate that makes it.
func secretProvided(r rendered, name string) bool {
	if r.find("Secret", name) != nil {
		return true
	}
	for _, o := range r.objs {
		if o.u.GetKind() == "Certificate" {
			if s, _, _ := unstructured.NestedString(o.u.Object, "spec", "secretName"); s == name {
				return true
			}
		}
	}
	return false
}

// checkContainer checks one container: CPU and memory requests and a memory limit, liveness and
// readiness probes on declared ports (when probed), and a securityContext that forbids privilege
// escalation.
func checkContainer(t *testing.T, ref string, c corev1.Container, probed bool) {
	if c.Image == "" || strings.HasSuffix(c.Image, ":") {
		t.Errorf("%s: image %q has no tag", ref, c.Image)
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[name]; !ok {
			t.Errorf("%s: no %s request", ref, name)
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Errorf("%s: no memory limit", ref)
	}
	for kind, p := range map[string]*corev1.Probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe} {
		if !probed {
			if p != nil {
				t.Errorf("%s: a regular init container may not have a %s", ref, kind)
			}
			continue
		}
		if p == nil {
			t.Errorf("%s: no %s", ref, kind)
			continue
		}
		if p.HTTPGet != nil && p.HTTPGet.Port.StrVal != "" && !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.HTTPGet.Port.StrVal }) {
			t.Errorf("%s: %s uses port %q, which the container does not declare", ref, kind, p.HTTPGet.Port.StrVal)
		}
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Errorf("%s: no securityContext", ref)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: securityContext.allowPrivilegeEscalation is not false", ref)
	case sc.Privileged != nil && *sc.Privileged:
		t.Errorf("%s: privileged", ref)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: securityContext.readOnlyRootFilesystem is not true", ref)
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
		t.Errorf("%s: securityContext.capabilities must drop ALL and add none, got %+v", ref, sc.Capabilities)
	}
}

// checkServices checks that every Service selects the pods of a rendered workload and targets
// ports they declare.
func checkServices(t *testing.T, r rendered) {
	for _, svc := range all[*corev1.Service](r) {
		ref := "Service " + svc.Name
		var pods []corev1.PodTemplateSpec
		for _, w := range r.workloads() {
			if len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.template.Labels)) {
				pods = append(pods, w.template)
			}
		}
		if len(pods) == 0 {
			t.Errorf("%s: selector %v matches no rendered workload", ref, svc.Spec.Selector)
			continue
		}
		for _, p := range svc.Spec.Ports {
			if name := p.TargetPort.StrVal; name != "" && !declaresPort(pods[0].Spec, name) {
				t.Errorf("%s: port %s targets %q, which the pods do not declare", ref, p.Name, name)
			}
		}
	}
}

func declaresPort(pod corev1.PodSpec, name string) bool {
	for _, c := range pod.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

// webhookConfig is the rendered webhook configuration (the webhook.yaml key of a ConfigMap), the
// zero value when the chart renders none.
func webhookConfig(t *testing.T, r rendered) webhook.ServerConfig {
	t.Helper()
	var cfg webhook.ServerConfig
	for _, cm := range all[*corev1.ConfigMap](r) {
		if data, ok := cm.Data["webhook.yaml"]; ok {
			if err := yaml.Unmarshal([]byte(data), &cfg); err != nil {
				t.Errorf("ConfigMap %s key webhook.yaml: %v", cm.Name, err)
			}
			return cfg
		}
	}
	return cfg
}

// checkWebhookConfigurations checks every mutating webhook: it never sees kube-system or the
// release namespace, is sent only the pods webhook.MatchConditions selects (with
// webhook.hamiCompat, webhook.HAMiCompatMatchConditions), calls a rendered Service on a port it exposes, has no side effects (none on a dry run with
// DRA conversion), a
// timeout the API server accepts, and a CA (a caBundle, or cert-manager's injection).
func checkWebhookConfigurations(t *testing.T, r rendered) {
	cfg := webhookConfig(t, r)
	for _, mwc := range all[*admissionregistrationv1.MutatingWebhookConfiguration](r) {
		injected := mwc.Annotations["cert-manager.io/inject-ca-from"] != ""
		for _, wh := range mwc.Webhooks {
			ref := "MutatingWebhookConfiguration " + mwc.Name + " webhook " + wh.Name
			excluded := excludedNamespaces(wh.NamespaceSelector)
			for _, ns := range []string{"kube-system", releaseNamespace} {
				if !slices.Contains(excluded, ns) {
					t.Errorf("%s: namespaceSelector does not exclude %s (excluded: %v)", ref, ns, excluded)
				}
			}
			want, wantName := webhook.MatchConditions(), "webhook.MatchConditions"
			if cfg.HAMiCompat {
				want, wantName = webhook.HAMiCompatMatchConditions(), "webhook.HAMiCompatMatchConditions (webhook.hamiCompat)"
			}
			if cfg.DRA.SteerClaims {
				want, wantName = webhook.WithClaims(want), "webhook.WithClaims("+wantName+") (dra.webhook.steerClaims)"
			}
			if diff := cmp.Diff(want, wh.MatchConditions); diff != "" {
				t.Errorf("%s: matchConditions differ from %s (-want +got):\n%s", ref, wantName, diff)
			}
			// With DRA conversion the webhook creates claim templates, never on a dry run.
			wantEffects := admissionregistrationv1.SideEffectClassNone
			if cfg.DRA.Enabled {
				wantEffects = admissionregistrationv1.SideEffectClassNoneOnDryRun
			}
			if wh.SideEffects == nil || *wh.SideEffects != wantEffects {
				t.Errorf("%s: sideEffects %v, want %s", ref, ptrString((*string)(wh.SideEffects)), wantEffects)
			}
			if wh.TimeoutSeconds == nil {
				t.Errorf("%s: no timeoutSeconds (the API server's default is 10)", ref)
			} else if s := *wh.TimeoutSeconds; s < 1 || s > 30 {
				t.Errorf("%s: timeoutSeconds %d, want 1 to 30", ref, s)
			}
			if injected == (len(wh.ClientConfig.CABundle) > 0) {
				t.Errorf("%s: want either a caBundle or cert-manager's inject-ca-from annotation (caBundle %d bytes, injected %v)", ref, len(wh.ClientConfig.CABundle), injected)
			}
			s := wh.ClientConfig.Service
			if s == nil {
				t.Errorf("%s: no clientConfig.service", ref)
				continue
			}
			svc, _ := findTyped[*corev1.Service](r, "Service", s.Namespace, s.Name)
			if svc == nil {
				t.Errorf("%s: calls Service %s/%s, which is not rendered", ref, s.Namespace, s.Name)
				continue
			}
			port := int32(443)
			if s.Port != nil {
				port = *s.Port
			}
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == port }) {
				t.Errorf("%s: calls port %d, which Service %s does not expose", ref, port, svc.Name)
			}
		}
	}
}

// excludedNamespaces returns the values of the selector's kubernetes.io/metadata.name NotIn
// expressions.
func excludedNamespaces(sel *metav1.LabelSelector) []string {
	if sel == nil {
		return nil
	}
	var out []string
	for _, e := range sel.MatchExpressions {
		if e.Key == corev1.LabelMetadataName && e.Operator == metav1.LabelSelectorOpNotIn {
			out = append(out, e.Values...)
		}
	}
	return out
}

// findTyped returns the typed object of kind, namespace and name, or the zero T.
func findTyped[T any](r rendered, kind, namespace, name string) (T, bool) {
	var zero T
	o := r.find(kind, name)
	if o == nil || o.u.GetNamespace() != namespace {
		return zero, false
	}
	v, ok := o.typed.(T)
	return v, ok
}

// checkDisruptionBudgets checks that every PodDisruptionBudget selects a rendered Deployment and
// lets at least one of its pods be evicted.
func checkDisruptionBudgets(t *testing.T, r rendered) {
	for _, pdb := range all[*policyv1.PodDisruptionBudget](r) {
		ref := "PodDisruptionBudget " + pdb.Name
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			t.Errorf("%s: %v", ref, err)
			continue
		}
		matched := false
		for _, w := range r.workloads() {
			if w.replicas == 0 || !sel.Matches(labels.Set(w.template.Labels)) {
				continue
			}
			matched = true
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() >= int(w.replicas) {
				t.Errorf("%s: minAvailable %v leaves no pod of %s (%d replicas) evictable", ref, pdb.Spec.MinAvailable, w.ref, w.replicas)
			}
		}
		if !matched {
			t.Errorf("%s: selects no rendered Deployment", ref)
		}
	}
}

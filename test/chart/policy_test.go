package chart

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuslice/gpuslice/test/harness/apiserver"
	"github.com/gpuslice/gpuslice/vgpu"
)

// The extender's user as the chart names it: the scheduler's ServiceAccount in the release
// namespace, and the start of the policy's denials.
const (
	extenderUser = "system:serviceaccount:" + releaseNamespace + ":" + releaseName + "-scheduler"
	policyDenial = "annotation hami.io/gpu-allocation is written only by the gpuslice scheduler extender (" + extenderUser + "); "
)

// policyEnv is a real API server holding the chart's allocation policy and the extender's own
// RBAC (not kube-scheduler's roles, which its ServiceAccount also has in an install).
type policyEnv struct {
	admin    kubernetes.Interface
	extender kubernetes.Interface // the admin's credentials impersonating extenderUser
}

// renderDefaults renders the chart with its default values and parses the objects.
func renderDefaults(t *testing.T, h helm) rendered {
	t.Helper()
	out, err := h.template("")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseRender(out)
	if err != nil {
		t.Fatal(err)
	}
	return rendered{objs: objs}
}

// startPolicyEnv renders the chart with its defaults, creates its ValidatingAdmissionPolicy and
// binding, and the extender's ClusterRole, heartbeat Role and their bindings, in a real API
// server, and waits until the policy denies.
func startPolicyEnv(t *testing.T, h helm) *policyEnv {
	t.Helper()
	r := renderDefaults(t, h)
	s := apiserver.Start(t, apiserver.Options{})
	impersonated := rest.CopyConfig(s.Config())
	impersonated.Impersonate = rest.ImpersonationConfig{UserName: extenderUser}
	e := &policyEnv{admin: kubernetes.NewForConfigOrDie(s.Config()), extender: kubernetes.NewForConfigOrDie(impersonated)}
	ctx := policyCtx(t)

	policy, ok := findTyped[*admissionregistrationv1.ValidatingAdmissionPolicy](r, "ValidatingAdmissionPolicy", "", releaseName+"-allocation")
	policyBinding, ok2 := findTyped[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](r, "ValidatingAdmissionPolicyBinding", "", releaseName+"-allocation")
	if !ok || !ok2 {
		t.Fatal("the chart renders no ValidatingAdmissionPolicy and binding " + releaseName + "-allocation")
	}
	if _, err := e.admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the chart's ValidatingAdmissionPolicy: %v", err)
	}
	if _, err := e.admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, policyBinding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the chart's ValidatingAdmissionPolicyBinding: %v", err)
	}
	role, ok := findTyped[*rbacv1.ClusterRole](r, "ClusterRole", "", releaseName+"-scheduler-extender")
	binding, ok2 := findTyped[*rbacv1.ClusterRoleBinding](r, "ClusterRoleBinding", "", releaseName+"-scheduler-extender")
	if !ok || !ok2 {
		t.Fatal("the chart renders no ClusterRole and ClusterRoleBinding " + releaseName + "-scheduler-extender")
	}
	if _, err := e.admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the extender's ClusterRole: %v", err)
	}
	if _, err := e.admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the extender's ClusterRoleBinding: %v", err)
	}
	leaseRole, ok := findTyped[*rbacv1.Role](r, "Role", corev1.NamespaceNodeLease, releaseName+"-scheduler-heartbeats")
	leaseBinding, ok2 := findTyped[*rbacv1.RoleBinding](r, "RoleBinding", corev1.NamespaceNodeLease, releaseName+"-scheduler-heartbeats")
	if !ok || !ok2 {
		t.Fatal("the chart renders no Role and RoleBinding " + releaseName + "-scheduler-heartbeats in " + corev1.NamespaceNodeLease)
	}
	if _, err := e.admin.RbacV1().Roles(corev1.NamespaceNodeLease).Create(ctx, leaseRole, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the extender's heartbeat Role: %v", err)
	}
	if _, err := e.admin.RbacV1().RoleBindings(corev1.NamespaceNodeLease).Create(ctx, leaseBinding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the extender's heartbeat RoleBinding: %v", err)
	}

	// The API server loads a new policy from its informer: wait until a probe pod with an
	// allocation is refused. The dry run leaves nothing behind.
	probe := policyPod("policy-probe")
	probe.Annotations = map[string]string{vgpu.AnnotationPodAllocation: "{}"}
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = e.admin.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, probe.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil && strings.Contains(last.Error(), policyDenial), nil
	}); err != nil {
		t.Fatalf("the chart's policy never denied an admin's pod with an allocation: last answer %v", last)
	}
	return e
}

// policyCtx bounds a test's calls to the API server.
func policyCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// policyPod is an unbound pod in the default namespace that no scheduler serves.
func policyPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			SchedulerName: "no-scheduler",
			Containers:    []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
}

// podBinding binds pod to node, with annotations in the Binding's metadata.
func podBinding(pod *corev1.Pod, node string, annotations map[string]string) *corev1.Binding {
	return &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, Annotations: annotations},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
}

// bindVia names the two ways to post a Binding: pods/<name>/binding, as the extender and
// kube-scheduler do, and the older bindings resource, which reaches the same storage.
type bindVia func(ctx context.Context, c kubernetes.Interface, b *corev1.Binding) error

func viaPodsBinding(ctx context.Context, c kubernetes.Interface, b *corev1.Binding) error {
	return c.CoreV1().Pods(b.Namespace).Bind(ctx, b, metav1.CreateOptions{})
}

func viaBindings(ctx context.Context, c kubernetes.Interface, b *corev1.Binding) error {
	return c.CoreV1().RESTClient().Post().Namespace(b.Namespace).Resource("bindings").Body(b).Do(ctx).Error()
}

// TestAllocationPolicy checks the chart's ValidatingAdmissionPolicy in a real API server: only
// the extender's ServiceAccount may set, change or remove a pod's hami.io/gpu-allocation, on the
// pod or through a Binding (pods/binding or bindings), while Bindings without it (any other
// scheduler's) and other annotations stay free. The extender's ClusterRole alone lets it bind
// with the allocation and patch pods, so its RBAC is checked with it.
func TestAllocationPolicy(t *testing.T) {
	h := requireHelm(t)
	e := startPolicyEnv(t, h)
	alloc := map[string]string{vgpu.AnnotationPodAllocation: `{"v":1}`}
	tests := []struct {
		name     string
		extender bool // the request is the extender's; else the admin's
		via      bindVia
		binding  map[string]string // the Binding's annotations
		wantDeny string            // the end of the denial; "" means allowed
		wantPod  string            // the pod's allocation afterwards
	}{
		{name: "admin binds with an allocation", via: viaPodsBinding, binding: alloc,
			wantDeny: "gpuslice-admin may not bind a pod with it"},
		{name: "admin binds with an empty allocation", via: viaPodsBinding, binding: map[string]string{vgpu.AnnotationPodAllocation: ""},
			wantDeny: "gpuslice-admin may not bind a pod with it"},
		{name: "admin binds with an allocation through bindings", via: viaBindings, binding: alloc,
			wantDeny: "gpuslice-admin may not bind a pod with it"},
		{name: "admin binds without an allocation", via: viaPodsBinding, binding: map[string]string{"example.com/note": "fine"}},
		{name: "admin binds without annotations through bindings", via: viaBindings},
		{name: "extender binds with an allocation", extender: true, via: viaPodsBinding, binding: alloc, wantPod: alloc[vgpu.AnnotationPodAllocation]},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := policyCtx(t)
			pod, err := e.admin.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, policyPod(fmt.Sprintf("bind-%d", i)), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c := e.admin
			if tt.extender {
				c = e.extender
			}
			err = tt.via(ctx, c, podBinding(pod, "node-1", tt.binding))
			switch {
			case tt.wantDeny == "" && err != nil:
				t.Fatalf("Binding refused: %v", err)
			case tt.wantDeny != "" && err == nil:
				t.Fatal("Binding accepted, want it denied")
			case tt.wantDeny != "" && ((!apierrors.IsForbidden(err) && !apierrors.IsInvalid(err)) || !strings.Contains(err.Error(), policyDenial+tt.wantDeny)):
				t.Fatalf("Binding refused with %v, want the policy's %q", err, policyDenial+tt.wantDeny)
			}
			got, err := e.admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if wantNode := map[bool]string{true: "", false: "node-1"}[tt.wantDeny != ""]; got.Spec.NodeName != wantNode {
				t.Errorf("pod bound to %q, want %q", got.Spec.NodeName, wantNode)
			}
			if a := got.Annotations[vgpu.AnnotationPodAllocation]; a != tt.wantPod {
				t.Errorf("pod allocation %q, want %q", a, tt.wantPod)
			}
		})
	}

	// On the pod itself: the admin may not change the extender's allocation, the extender may;
	// other annotations stay free.
	ctx := policyCtx(t)
	pod, err := e.admin.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, policyPod("patched"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patch := func(c kubernetes.Interface, annotations string) error {
		body := []byte(`{"metadata":{"annotations":` + annotations + `}}`)
		_, err := c.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, body, metav1.PatchOptions{})
		return err
	}
	if err := patch(e.extender, `{"`+vgpu.AnnotationPodAllocation+`":"{}"}`); err != nil {
		t.Errorf("the extender setting an allocation: %v, want it allowed", err)
	}
	if err := patch(e.admin, `{"`+vgpu.AnnotationPodAllocation+`":null}`); err == nil || !strings.Contains(err.Error(), policyDenial+"gpuslice-admin may not set, change or remove it") {
		t.Errorf("the admin removing an allocation: %v, want the policy's denial", err)
	}
	if err := patch(e.admin, `{"example.com/note":"fine"}`); err != nil {
		t.Errorf("the admin setting another annotation: %v, want it allowed", err)
	}
	// The extender may patch every pod (RBAC), for its retry annotation only.
	if err := patch(e.extender, `{"gpuslice.io/scheduler-retry":"2026-01-01T00:00:00Z"}`); err != nil {
		t.Errorf("the extender setting its retry annotation: %v, want it allowed", err)
	}
	const extenderDenial = "the gpuslice scheduler extender may change only the gpuslice.io/scheduler-retry and hami.io/gpu-allocation annotations of a pod"
	if err := patch(e.extender, `{"example.com/note":"changed"}`); err == nil || !strings.Contains(err.Error(), extenderDenial) {
		t.Errorf("the extender changing another annotation: %v, want the policy's denial", err)
	}
	body := []byte(`{"metadata":{"labels":{"app":"x"}}}`)
	if _, err := e.extender.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, body, metav1.PatchOptions{}); err == nil || !strings.Contains(err.Error(), extenderDenial) {
		t.Errorf("the extender setting a label: %v, want the policy's denial", err)
	}
}

// TestExtenderRBAC checks, with the real RBAC authorizer, that the chart's rules for the extender
// grant what it does (extender/*.go: informers on Nodes, Pods and the heartbeat Leases, a GET of a
// pod the informer has not seen, the retry annotation's patch, one Binding per bind) and nothing
// around it that it used to need or never did.
func TestExtenderRBAC(t *testing.T) {
	h := requireHelm(t)
	e := startPolicyEnv(t, h)
	ctx := policyCtx(t)
	type access struct{ namespace, verb, resource, subresource, group string }
	tests := []struct {
		access
		want bool
	}{
		{access{"", "list", "nodes", "", ""}, true},
		{access{"", "watch", "nodes", "", ""}, true},
		{access{"default", "list", "pods", "", ""}, true},
		{access{"default", "watch", "pods", "", ""}, true},
		{access{"default", "get", "pods", "", ""}, true},
		{access{"default", "patch", "pods", "", ""}, true},
		{access{"default", "create", "pods", "binding", ""}, true},
		{access{corev1.NamespaceNodeLease, "list", "leases", "", "coordination.k8s.io"}, true},
		{access{corev1.NamespaceNodeLease, "watch", "leases", "", "coordination.k8s.io"}, true},
		{access{"", "get", "nodes", "", ""}, false},
		{access{"", "patch", "nodes", "", ""}, false},
		{access{"default", "update", "pods", "", ""}, false},
		{access{"default", "delete", "pods", "", ""}, false},
		{access{"default", "patch", "pods", "status", ""}, false},
		{access{"default", "create", "bindings", "", ""}, false},
		{access{"default", "create", "events", "", ""}, false},
		{access{"default", "create", "events", "", "events.k8s.io"}, false},
		{access{corev1.NamespaceNodeLease, "update", "leases", "", "coordination.k8s.io"}, false},
		{access{"default", "list", "leases", "", "coordination.k8s.io"}, false},
		{access{"default", "get", "secrets", "", ""}, false},
		// DRA scoring's informers only with dra.enabled (TestDRAPluginRBAC).
		{access{"", "list", "resourceslices", "", "resource.k8s.io"}, false},
		{access{"default", "list", "resourceclaims", "", "resource.k8s.io"}, false},
	}
	for _, tt := range tests {
		a := tt.access
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   extenderUser,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: a.namespace, Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource,
			},
		}}
		got, err := e.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != tt.want {
			t.Errorf("%+v: allowed %t, want %t (%s)", a, got.Status.Allowed, tt.want, got.Status.Reason)
		}
	}
}

package chart

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/test/harness/apiserver"
	"github.com/gpuslice/gpuslice/vgpu"
)

// draValues is the values file that turns DRA mode on.
const draValues = valuesDir + "/dra.yaml"

// draPluginUser is the DRA driver's user as the chart names it.
const draPluginUser = "system:serviceaccount:" + releaseNamespace + ":" + releaseName + "-dra-plugin"

// renderDRA renders the chart with draValues and parses the objects.
func renderDRA(t *testing.T, h helm) rendered {
	t.Helper()
	out, err := h.template(draValues)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseRender(out)
	if err != nil {
		t.Fatal(err)
	}
	return rendered{objs: objs}
}

// runsOn reports whether a pod of ds may run on node, by the DaemonSet's node selector and
// required node affinity (the DaemonSet controller's own test).
func runsOn(ds *appsv1.DaemonSet, node *corev1.Node) bool {
	pod := &corev1.Pod{Spec: ds.Spec.Template.Spec}
	ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)
	return err == nil && ok
}

// TestDRANodePools checks that every node runs exactly one of the two node agents: the DRA
// driver on nodes labelled gpuslice.hami.io/mode=dra, a device plugin DaemonSet on the other GPU
// nodes, and that the default render has no DRA object at all.
func TestDRANodePools(t *testing.T) {
	h := requireHelm(t)
	if r := renderDefaults(t, h); r.find("DaemonSet", releaseName+"-dra-plugin") != nil || r.find("DeviceClass", "gpuslice.hami.io") != nil {
		t.Error("the default render has DRA objects; dra.enabled is false by default")
	}
	r := renderDRA(t, h)
	var dra *appsv1.DaemonSet
	var plugins []*appsv1.DaemonSet
	for _, ds := range all[*appsv1.DaemonSet](r) {
		switch ds.Name {
		case releaseName + "-dra-plugin":
			dra = ds
		default:
			plugins = append(plugins, ds)
		}
	}
	if dra == nil || len(plugins) == 0 {
		t.Fatalf("want the DRA DaemonSet and a device plugin DaemonSet, got dra %v and %d others", dra != nil, len(plugins))
	}
	node := func(name string, labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	tests := []struct {
		node              *corev1.Node
		wantDRA, wantPlug bool
	}{
		{node("dra", map[string]string{"gpuslice.hami.io/mode": "dra", "nvidia.com/gpu.present": "true"}), true, false},
		{node("dra-no-gfd", map[string]string{"gpuslice.hami.io/mode": "dra"}), true, false},
		{node("device-plugin", map[string]string{"nvidia.com/gpu.present": "true"}), false, true},
		{node("other-mode", map[string]string{"gpuslice.hami.io/mode": "device-plugin", "nvidia.com/gpu.present": "true"}), false, true},
		{node("cpu", nil), false, false},
	}
	for _, tt := range tests {
		if got := runsOn(dra, tt.node); got != tt.wantDRA {
			t.Errorf("node %s %v: DRA driver runs there %t, want %t", tt.node.Name, tt.node.Labels, got, tt.wantDRA)
		}
		for _, ds := range plugins {
			if got := runsOn(ds, tt.node); got != tt.wantPlug {
				t.Errorf("node %s %v: device plugin DaemonSet %s runs there %t, want %t", tt.node.Name, tt.node.Labels, ds.Name, got, tt.wantPlug)
			}
		}
	}
	cm, _ := findTyped[*corev1.ConfigMap](r, "ConfigMap", releaseNamespace, releaseName+"-dra-plugin")
	if cm == nil {
		t.Fatal("no ConfigMap " + releaseName + "-dra-plugin")
	}
	for _, want := range []string{`fakeGPUs: "2xA100-80GB"`, "reservedMemoryMiB: 512", `excludeGPUs: ["1"]`, `registrarDir: "/var/lib/kubelet/plugins_registry"`, `pluginDir: "/var/lib/kubelet/plugins/gpuslice.hami.io"`} {
		if !strings.Contains(cm.Data["config.yaml"], want) {
			t.Errorf("DRA driver config %q: want %s", cm.Data["config.yaml"], want)
		}
	}
	wh, _ := findTyped[*appsv1.Deployment](r, "Deployment", releaseNamespace, releaseName+"-webhook")
	if wh == nil || wh.Spec.Template.Spec.ServiceAccountName != releaseName+"-webhook" {
		t.Errorf("webhook Deployment %v: want ServiceAccount %s-webhook, which may create claim templates", wh != nil, releaseName)
	}
}

// createDRAObjects creates the DRA objects of the render in a real API server, failing t on the
// first error.
func createDRAObjects(ctx context.Context, t *testing.T, admin kubernetes.Interface, r rendered) {
	t.Helper()
	for _, dc := range all[*resourcev1.DeviceClass](r) {
		// The API server compiles the CEL selectors: a bad expression fails here.
		if _, err := admin.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create DeviceClass %s: %v", dc.Name, err)
		}
	}
	name := releaseName + "-dra-plugin"
	role, ok := findTyped[*rbacv1.ClusterRole](r, "ClusterRole", "", name)
	binding, ok2 := findTyped[*rbacv1.ClusterRoleBinding](r, "ClusterRoleBinding", "", name)
	policy, ok3 := findTyped[*admissionregistrationv1.ValidatingAdmissionPolicy](r, "ValidatingAdmissionPolicy", "", name+"-node")
	policyBinding, ok4 := findTyped[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](r, "ValidatingAdmissionPolicyBinding", "", name+"-node")
	if !ok || !ok2 || !ok3 || !ok4 {
		t.Fatalf("the DRA render lacks the ClusterRole, ClusterRoleBinding, ValidatingAdmissionPolicy or its binding %s", name)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the DRA node policy: %v", err)
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, policyBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The heartbeat Lease's Role, and the node policy it shares with the device plugin.
	leaseRole, ok := findTyped[*rbacv1.Role](r, "Role", corev1.NamespaceNodeLease, name)
	leaseBinding, ok2 := findTyped[*rbacv1.RoleBinding](r, "RoleBinding", corev1.NamespaceNodeLease, name)
	nodePolicy, ok3 := findTyped[*admissionregistrationv1.ValidatingAdmissionPolicy](r, "ValidatingAdmissionPolicy", "", releaseName+"-device-plugin-node")
	nodePolicyBinding, ok4 := findTyped[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](r, "ValidatingAdmissionPolicyBinding", "", releaseName+"-device-plugin-node")
	if !ok || !ok2 || !ok3 || !ok4 {
		t.Fatalf("the DRA render lacks the Lease Role or RoleBinding %s or the node policy %s-device-plugin-node or its binding", name, releaseName)
	}
	if _, err := admin.RbacV1().Roles(corev1.NamespaceNodeLease).Create(ctx, leaseRole, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(corev1.NamespaceNodeLease).Create(ctx, leaseBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, nodePolicy, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the node policy: %v", err)
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, nodePolicyBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// slice is a ResourceSlice of gpuslice's driver for node.
func slice(name, node string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: "gpuslice.hami.io", NodeName: ptr.To(node),
			Pool:    resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-0"}},
		},
	}
}

// TestDRAPluginRBAC checks the DRA driver's and the webhook's permissions in a real API server:
// exactly the verbs
// the ResourceSlice controller and NodePrepareResources use, and, through the chart's policy, only
// on its own node's ResourceSlices (the node name of a pod-bound token, impersonated here).
func TestDRAPluginRBAC(t *testing.T) {
	h := requireHelm(t)
	r := renderDRA(t, h)
	s := apiserver.Start(t, apiserver.Options{})
	admin := kubernetes.NewForConfigOrDie(s.Config())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createDRAObjects(ctx, t, admin, r)

	type access struct{ verb, resource, subresource, group string }
	rs := "resource.k8s.io"
	tests := []struct {
		access
		want bool
	}{
		{access{"get", "resourceslices", "", rs}, true},
		{access{"list", "resourceslices", "", rs}, true},
		{access{"watch", "resourceslices", "", rs}, true},
		{access{"create", "resourceslices", "", rs}, true},
		{access{"update", "resourceslices", "", rs}, true},
		{access{"delete", "resourceslices", "", rs}, true},
		{access{"get", "resourceclaims", "", rs}, true},
		{access{"get", "nodes", "", ""}, true},
		{access{"patch", "resourceslices", "", rs}, false},
		{access{"deletecollection", "resourceslices", "", rs}, false},
		{access{"list", "resourceclaims", "", rs}, false},
		{access{"update", "resourceclaims", "", rs}, false},
		{access{"create", "deviceclasses", "", rs}, false},
		{access{"patch", "nodes", "", ""}, false},
		{access{"list", "pods", "", ""}, false},
		{access{"get", "secrets", "", ""}, false},
		{access{"patch", "nodes", "status", ""}, true},
		{access{"update", "nodes", "status", ""}, false},
		{access{"get", "leases", "", "coordination.k8s.io"}, true},
		{access{"create", "leases", "", "coordination.k8s.io"}, true},
		{access{"update", "leases", "", "coordination.k8s.io"}, true},
		{access{"delete", "leases", "", "coordination.k8s.io"}, false},
		{access{"list", "leases", "", "coordination.k8s.io"}, false},
	}
	for _, tt := range tests {
		ns := ""
		switch tt.resource {
		case "resourceclaims", "pods", "secrets":
			ns = metav1.NamespaceDefault
		case "leases":
			ns = corev1.NamespaceNodeLease
		}
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               draPluginUser,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: tt.verb, Group: tt.group, Resource: tt.resource, Subresource: tt.subresource},
		}}
		got, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != tt.want {
			t.Errorf("%+v: allowed %t, want %t (%s)", tt.access, got.Status.Allowed, tt.want, got.Status.Reason)
		}
	}

	webhookRole, ok := findTyped[*rbacv1.ClusterRole](r, "ClusterRole", "", releaseName+"-webhook")
	webhookBinding, ok2 := findTyped[*rbacv1.ClusterRoleBinding](r, "ClusterRoleBinding", "", releaseName+"-webhook")
	if !ok || !ok2 {
		t.Fatal("the DRA render lacks the webhook's ClusterRole or binding")
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, webhookRole, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, webhookBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The extender's DRA scoring: informers on the driver's slices, the claims and the classes.
	extenderRole, ok := findTyped[*rbacv1.ClusterRole](r, "ClusterRole", "", releaseName+"-scheduler-extender")
	extenderBinding, ok2 := findTyped[*rbacv1.ClusterRoleBinding](r, "ClusterRoleBinding", "", releaseName+"-scheduler-extender")
	if !ok || !ok2 {
		t.Fatal("the DRA render lacks the extender's ClusterRole or binding")
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, extenderRole, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, extenderBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	webhookUser := "system:serviceaccount:" + releaseNamespace + ":" + releaseName + "-webhook"
	extenderUser := "system:serviceaccount:" + releaseNamespace + ":" + releaseName + "-scheduler"
	type grant struct {
		user, namespace, verb, resource string
		want                            bool
	}
	grants := []grant{
		{webhookUser, "ml", "create", "resourceclaimtemplates", true}, {webhookUser, "ml", "get", "resourceclaimtemplates", true}, {webhookUser, "ml", "update", "resourceclaimtemplates", false},
		{webhookUser, "ml", "delete", "resourceclaimtemplates", false}, {webhookUser, "ml", "create", "resourceclaims", false},
		{extenderUser, "", "list", "resourceslices", true}, {extenderUser, "", "watch", "resourceslices", true},
		{extenderUser, "ml", "list", "resourceclaims", true}, {extenderUser, "ml", "watch", "resourceclaims", true},
		{extenderUser, "", "list", "deviceclasses", true}, {extenderUser, "", "watch", "deviceclasses", true},
		{extenderUser, "ml", "get", "resourceclaims", false}, {extenderUser, "ml", "update", "resourceclaims", false},
		{extenderUser, "", "create", "resourceslices", false}, {extenderUser, "ml", "list", "resourceclaimtemplates", false},
	}
	allowed := func(g grant) (bool, error) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: g.user, Groups: []string{"system:serviceaccounts", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: g.namespace, Verb: g.verb, Group: rs, Resource: g.resource},
		}}
		got, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return got.Status.Allowed, nil
	}
	// The RBAC authorizer reads roles from its informer: wait until the granted ones are seen.
	for _, g := range grants {
		if !g.want {
			continue
		}
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return allowed(g) }); err != nil {
			t.Errorf("%s %s %s: never allowed: %v", g.user, g.verb, g.resource, err)
		}
	}
	for _, g := range grants {
		got, err := allowed(g)
		if err != nil {
			t.Fatal(err)
		}
		if got != g.want {
			t.Errorf("%s %s %s: allowed %t, want %t", g.user, g.verb, g.resource, got, g.want)
		}
	}

	as := func(node string) kubernetes.Interface {
		cfg := rest.CopyConfig(s.Config())
		cfg.Impersonate = rest.ImpersonationConfig{UserName: draPluginUser, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
		if node != "" {
			cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
		}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	nodeA := as("node-a")
	// The API server loads a new policy from its informer: wait until node-a's driver is refused
	// node-b's slice (dry run: nothing is left behind).
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = nodeA.ResourceV1().ResourceSlices().Create(ctx, slice("probe", "node-b"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil && strings.Contains(last.Error(), "may only write ResourceSlices of its own node"), nil
	}); err != nil {
		t.Fatalf("the DRA node policy never denied another node's slice: last answer %v", last)
	}
	own, err := nodeA.ResourceV1().ResourceSlices().Create(ctx, slice("node-a-gpus", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node-a's driver creating its own slice: %v", err)
	}
	own.Spec.Devices = append(own.Spec.Devices, resourcev1.Device{Name: "gpu-1"})
	if own, err = nodeA.ResourceV1().ResourceSlices().Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node-a's driver updating its own slice: %v", err)
	}
	other, err := admin.ResourceV1().ResourceSlices().Create(ctx, slice("node-b-gpus", "node-b"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	denied := []struct {
		name string
		call func() error
	}{
		{"create node-b's slice", func() error {
			_, err := nodeA.ResourceV1().ResourceSlices().Create(ctx, slice("x", "node-b"), metav1.CreateOptions{})
			return err
		}},
		{"update node-b's slice", func() error {
			_, err := nodeA.ResourceV1().ResourceSlices().Update(ctx, other, metav1.UpdateOptions{})
			return err
		}},
		{"delete node-b's slice", func() error {
			return nodeA.ResourceV1().ResourceSlices().Delete(ctx, other.Name, metav1.DeleteOptions{})
		}},
		{"unbound token creates a slice", func() error {
			_, err := as("").ResourceV1().ResourceSlices().Create(ctx, slice("y", "node-a"), metav1.CreateOptions{})
			return err
		}},
	}
	for _, d := range denied {
		if err := d.call(); err == nil {
			t.Errorf("%s: allowed, want denied by the DRA node policy", d.name)
		}
	}
	if err := nodeA.ResourceV1().ResourceSlices().Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("node-a's driver deleting its own slice: %v", err)
	}
	// The node condition and the heartbeat Lease (node/publish): its own, nothing else.
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = patchNodeStatus(ctx, nodeA, "node-b", registeredPatch)
		return last != nil && strings.Contains(last.Error(), "the gpuslice DRA driver of node node-a"), nil
	}); err != nil {
		t.Fatalf("the node policy never denied node-a's DRA driver writing node-b's condition: last answer %v", last)
	}
	if err := patchNodeStatus(ctx, nodeA, "node-a", registeredPatch); err != nil {
		t.Errorf("node-a's driver setting its own condition: %v", err)
	}
	leases := nodeA.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: vgpu.HeartbeatLeaseName("node-a")}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("node-a's driver creating its heartbeat Lease: %v", err)
	}
	for _, d := range []struct {
		name string
		call func() error
	}{
		{"patch node-a's labels", func() error { return patchNode(ctx, nodeA, "node-a", `{"metadata":{"labels":{"zone":"x"}}}`) }},
		{"create the kubelet's Lease node-a", func() error {
			_, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
			return err
		}},
		{"create node-b's heartbeat Lease", func() error {
			_, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: vgpu.HeartbeatLeaseName("node-b")}}, metav1.CreateOptions{})
			return err
		}},
	} {
		if err := d.call(); err == nil {
			t.Errorf("%s: allowed, want denied", d.name)
		}
	}
}

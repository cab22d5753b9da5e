package chart

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
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

// pluginAccount is the device plugin's ServiceAccount as the chart names it.
const pluginAccount = releaseName + "-device-plugin"

// Two Nodes whose names are the longest allowed (253 characters) and share their first 228
// characters, the most of a name a shortened heartbeat Lease name keeps
// (vgpu.HeartbeatLeaseNodePrefix).
var (
	longNodeA = strings.Repeat("l", vgpu.HeartbeatLeaseNodePrefix) + "-" + strings.Repeat("a", 24)
	longNodeB = strings.Repeat("l", vgpu.HeartbeatLeaseNodePrefix) + "-" + strings.Repeat("b", 24)
)

// nodePolicyEnv is a real API server with the chart's device-plugin RBAC and node policy, the
// Nodes node-a, node-b, longNodeA and longNodeB, the kubelet Lease of node-a, and the device
// plugin's pods on node-a and longNodeA.
type nodePolicyEnv struct {
	admin kubernetes.Interface
	// onNodeA is the plugin pod's own pod-bound token (node-name claim node-a); onLongNodeA that
	// of the pod on longNodeA; unbound is a token of the same ServiceAccount bound to no pod.
	onNodeA, onLongNodeA, unbound kubernetes.Interface
}

func startNodePolicyEnv(t *testing.T, h helm) *nodePolicyEnv {
	t.Helper()
	r := renderDefaults(t, h)
	s := apiserver.Start(t, apiserver.Options{})
	e := &nodePolicyEnv{admin: kubernetes.NewForConfigOrDie(s.Config())}
	ctx := policyCtx(t)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	_, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNamespace}}, metav1.CreateOptions{})
	must("create the release namespace", err)
	sa, ok := findTyped[*corev1.ServiceAccount](r, "ServiceAccount", releaseNamespace, pluginAccount)
	role, ok2 := findTyped[*rbacv1.ClusterRole](r, "ClusterRole", "", pluginAccount)
	binding, ok3 := findTyped[*rbacv1.ClusterRoleBinding](r, "ClusterRoleBinding", "", pluginAccount)
	leaseRole, ok4 := findTyped[*rbacv1.Role](r, "Role", corev1.NamespaceNodeLease, pluginAccount)
	leaseBinding, ok5 := findTyped[*rbacv1.RoleBinding](r, "RoleBinding", corev1.NamespaceNodeLease, pluginAccount)
	policy, ok6 := findTyped[*admissionregistrationv1.ValidatingAdmissionPolicy](r, "ValidatingAdmissionPolicy", "", releaseName+"-device-plugin-node")
	policyBinding, ok7 := findTyped[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](r, "ValidatingAdmissionPolicyBinding", "", releaseName+"-device-plugin-node")
	if !ok || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || !ok7 {
		t.Fatal("the chart does not render the device plugin's ServiceAccount, RBAC and node policy")
	}
	_, err = e.admin.CoreV1().ServiceAccounts(releaseNamespace).Create(ctx, sa, metav1.CreateOptions{})
	must("create the plugin's ServiceAccount", err)
	_, err = e.admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
	must("create the plugin's ClusterRole", err)
	_, err = e.admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
	must("create the plugin's ClusterRoleBinding", err)
	_, err = e.admin.RbacV1().Roles(corev1.NamespaceNodeLease).Create(ctx, leaseRole, metav1.CreateOptions{})
	must("create the plugin's Lease Role", err)
	_, err = e.admin.RbacV1().RoleBindings(corev1.NamespaceNodeLease).Create(ctx, leaseBinding, metav1.CreateOptions{})
	must("create the plugin's Lease RoleBinding", err)
	_, err = e.admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{})
	must("create the node policy", err)
	_, err = e.admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, policyBinding, metav1.CreateOptions{})
	must("create the node policy's binding", err)
	for _, n := range []string{"node-a", "node-b", longNodeA, longNodeB} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"topology.kubernetes.io/zone": "z1"}}}
		_, err = e.admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		must("create Node "+n, err)
	}
	_, err = e.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	must("create the kubelet's Lease of node-a", err)
	pluginPod := func(name, node string) *corev1.Pod {
		t.Helper()
		pod, err := e.admin.CoreV1().Pods(releaseNamespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: releaseNamespace},
			Spec: corev1.PodSpec{
				ServiceAccountName: pluginAccount, NodeName: node,
				Containers: []corev1.Container{{Name: "plugin", Image: "registry.k8s.io/pause:3.10"}},
			},
		}, metav1.CreateOptions{})
		must("create the plugin's pod "+name, err)
		return pod
	}
	pod, longPod := pluginPod("device-plugin-a", "node-a"), pluginPod("device-plugin-long-a", longNodeA)
	client := func(bound *authenticationv1.BoundObjectReference) kubernetes.Interface {
		tr, err := e.admin.CoreV1().ServiceAccounts(releaseNamespace).CreateToken(ctx, pluginAccount,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: bound}}, metav1.CreateOptions{})
		must("request a token", err)
		cfg := rest.AnonymousClientConfig(s.Config())
		cfg.BearerToken = tr.Status.Token
		return kubernetes.NewForConfigOrDie(cfg)
	}
	e.onNodeA = client(&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	e.onLongNodeA = client(&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: longPod.Name, UID: longPod.UID})
	e.unbound = client(nil)

	// The API server loads the policy from its informer: wait until it denies.
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = patchNode(ctx, e.onNodeA, "node-b", `{"metadata":{"annotations":{"hami.io/probe":"x"}}}`)
		return last != nil && strings.Contains(last.Error(), "the gpuslice device plugin of node node-a"), nil
	}); err != nil {
		t.Fatalf("the chart's node policy never denied node-a's plugin writing node-b: last answer %v", last)
	}
	return e
}

func patchNode(ctx context.Context, c kubernetes.Interface, name, patch string) error {
	_, err := c.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// patchNodeStatus applies a strategic merge patch to the Node's status, as the plugin writes its
// registration condition.
func patchNodeStatus(ctx context.Context, c kubernetes.Interface, name, patch string) error {
	_, err := c.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
	return err
}

// registeredPatch sets the GPUSliceRegistered condition True.
var registeredPatch = `{"status":{"conditions":[{"type":"` + string(vgpu.ConditionRegistered) + `","status":"True","reason":"` + vgpu.ReasonRegistered + `"}]}}`

// TestDevicePluginNodePolicy checks, with the real API server, the RBAC authorizer and the
// chart's ValidatingAdmissionPolicy, what a token of node-a's plugin pod may do: its own Node's
// hami.io/* labels and annotations, its GPUSliceRegistered condition and its own heartbeat
// Lease, and nothing of node-b, of the kubelet's Lease, of any other label or of its Node's
// finalizers and ownerReferences; a token bound to no pod may change nothing. The plugin of a
// node with a 253-character name may write its shortened heartbeat Lease, but not one that
// another node's agent holds.
func TestDevicePluginNodePolicy(t *testing.T) {
	h := requireHelm(t)
	e := startNodePolicyEnv(t, h)
	ctx := policyCtx(t)
	leases := func(c kubernetes.Interface) func(name string) error {
		return func(name string) error {
			_, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			return err
		}
	}
	updateLease := func(name string) error {
		l, err := e.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		l.Spec.HolderIdentity = new(string)
		*l.Spec.HolderIdentity = "gpuslice"
		_, err = e.onNodeA.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(ctx, l, metav1.UpdateOptions{})
		return err
	}
	// heartbeat writes the Lease name held by holder as c: created when it does not exist,
	// else updated.
	heartbeat := func(c kubernetes.Interface, name, holder string) error {
		leases := c.CoordinationV1().Leases(corev1.NamespaceNodeLease)
		l, err := e.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		l.Spec.HolderIdentity = &holder
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	}
	longLease, longHolder := vgpu.HeartbeatLeaseName(longNodeA), "gpuslice-device-plugin/"+longNodeA
	// longNodeB's agent holds its Lease, whose name longNodeA's agent can compute.
	if err := heartbeat(e.admin, vgpu.HeartbeatLeaseName(longNodeB), "gpuslice-device-plugin/"+longNodeB); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		do       func() error
		wantDeny string // "" means allowed
	}{
		{"own Node: finalizers", func() error {
			return patchNode(ctx, e.onNodeA, "node-a", `{"metadata":{"finalizers":["example.com/keep"]}}`)
		}, "may change only the hami.io/* labels and annotations of its Node"},
		{"own Node: ownerReferences", func() error {
			return patchNode(ctx, e.onNodeA, "node-a", `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"x","uid":"0b7c5f5e-1c1a-4f0e-9a57-3d7c1f0f6a11"}]}}`)
		}, "may change only the hami.io/* labels and annotations of its Node"},
		{"long node name: own ready label", func() error {
			return patchNode(ctx, e.onLongNodeA, longNodeA, `{"metadata":{"labels":{"`+vgpu.LabelGPUReady+`":"true"}}}`)
		}, ""},
		{"long node name: own heartbeat Lease: create", func() error { return heartbeat(e.onLongNodeA, longLease, longHolder) }, ""},
		{"long node name: own heartbeat Lease: update", func() error { return heartbeat(e.onLongNodeA, longLease, longHolder) }, ""},
		{"long node name: own heartbeat Lease given to another holder", func() error {
			return heartbeat(e.onLongNodeA, longLease, "gpuslice-device-plugin/"+longNodeB)
		}, "held by its agent, not kube-node-lease/" + longLease},
		{"long node name: the Lease another node's agent holds", func() error {
			return heartbeat(e.onLongNodeA, vgpu.HeartbeatLeaseName(longNodeB), longHolder)
		}, "held by its agent, not kube-node-lease/" + vgpu.HeartbeatLeaseName(longNodeB)},
		{"long node name: its prefix without the hash", func() error {
			return heartbeat(e.onLongNodeA, longLease[:237]+"not-a-sha256-hex", longHolder)
		}, "may write only its own heartbeat Lease gpuslice-" + longNodeA[:vgpu.HeartbeatLeaseNodePrefix] + "<16 hex digits of the SHA-256 of " + longNodeA + ">"},
		{"own Node: inventory annotation", func() error {
			return patchNode(ctx, e.onNodeA, "node-a", `{"metadata":{"annotations":{"`+vgpu.AnnotationNodeInventory+`":"{}"}}}`)
		}, ""},
		{"own Node: ready label", func() error {
			return patchNode(ctx, e.onNodeA, "node-a", `{"metadata":{"labels":{"`+vgpu.LabelGPUReady+`":"true"}}}`)
		}, ""},
		{"own Node: registration condition", func() error {
			return patchNodeStatus(ctx, e.onNodeA, "node-a", registeredPatch)
		}, ""},
		{"another Node's registration condition", func() error {
			return patchNodeStatus(ctx, e.onNodeA, "node-b", registeredPatch)
		}, "may only update its own Node, not UPDATE Node node-b/status"},
		{"own Node: the Ready condition", func() error {
			return patchNodeStatus(ctx, e.onNodeA, "node-a", `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"X"}]}}`)
		}, "may change only the GPUSliceRegistered condition of its Node status"},
		{"own Node: allocatable", func() error {
			return patchNodeStatus(ctx, e.onNodeA, "node-a", `{"status":{"allocatable":{"`+string(vgpu.ResourceGPU)+`":"100"}}}`)
		}, "may change only the GPUSliceRegistered condition of its Node status"},
		{"own heartbeat Lease: create", func() error { return leases(e.onNodeA)(vgpu.HeartbeatLeaseName("node-a")) }, ""},
		{"own heartbeat Lease: update", func() error { return updateLease(vgpu.HeartbeatLeaseName("node-a")) }, ""},
		{"another Node", func() error {
			return patchNode(ctx, e.onNodeA, "node-b", `{"metadata":{"annotations":{"`+vgpu.AnnotationNodeInventory+`":"{}"}}}`)
		}, "may only update its own Node, not UPDATE Node node-b"},
		{"own Node: another label", func() error {
			return patchNode(ctx, e.onNodeA, "node-a", `{"metadata":{"labels":{"topology.kubernetes.io/zone":"z2"}}}`)
		}, "may change only the hami.io/* labels and annotations of its Node"},
		{"own Node: remove another label", func() error {
			return patchNode(ctx, e.onNodeA, "node-a", `{"metadata":{"labels":{"topology.kubernetes.io/zone":null}}}`)
		}, "may change only the hami.io/* labels and annotations of its Node"},
		{"own Node: another annotation", func() error {
			return patchNode(ctx, e.onNodeA, "node-a", `{"metadata":{"annotations":{"example.com/note":"x"}}}`)
		}, "may change only the hami.io/* labels and annotations of its Node"},
		{"own Node: spec", func() error { return patchNode(ctx, e.onNodeA, "node-a", `{"spec":{"unschedulable":true}}`) },
			"may change only the hami.io/* labels and annotations of its Node"},
		{"the kubelet's Lease", func() error { return updateLease("node-a") },
			"may write only its own heartbeat Lease gpuslice-node-a, not kube-node-lease/node-a"},
		{"another node's heartbeat Lease", func() error { return leases(e.onNodeA)(vgpu.HeartbeatLeaseName("node-b")) },
			"may write only its own heartbeat Lease gpuslice-node-a, not kube-node-lease/gpuslice-node-b"},
		{"a token bound to no pod", func() error {
			return patchNode(ctx, e.unbound, "node-a", `{"metadata":{"annotations":{"`+vgpu.AnnotationNodeInventory+`":"{}"}}}`)
		}, "may write only with a pod-bound ServiceAccount token"},
	}
	for _, tt := range tests {
		checkAnswer(t, tt.name, tt.do(), tt.wantDeny)
	}
	node, err := e.admin.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, changed := node.Annotations[vgpu.AnnotationNodeInventory]; changed {
		t.Error("node-b has an inventory annotation written by node-a's plugin")
	}
	if _, changed := vgpu.RegisteredCondition(node); changed {
		t.Error("node-b has a registration condition written by node-a's plugin")
	}
}

// checkAnswer fails t unless err, the API server's answer to the write named name, is an
// allowance when wantDeny is empty, or else a denial whose message contains wantDeny.
func checkAnswer(t *testing.T, name string, err error, wantDeny string) {
	t.Helper()
	switch {
	case wantDeny == "" && err != nil:
		t.Errorf("%s: %v, want it allowed", name, err)
	case wantDeny != "" && (err == nil || !strings.Contains(err.Error(), wantDeny)):
		t.Errorf("%s: %v, want a denial containing %q", name, err, wantDeny)
	}
}

package chart

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuslice/gpuslice/vgpu"
)

// statusPolicyName is the chart's policy on the extender's Node writes.
const statusPolicyName = releaseName + "-scheduler-node-status"

// TestExtenderNodeStatusPolicy checks, with the real API server, the RBAC authorizer and the
// chart's ValidatingAdmissionPolicy, what the extender's ServiceAccount may write of a Node: the
// GPUSliceRegistered condition of its status, as the extender's node-condition controller patches
// it, and no other condition, status field, label or annotation. A ClusterRole of the test grants
// it every write on Nodes, so that each refusal below is the policy's, not RBAC's; the admin is
// not matched.
func TestExtenderNodeStatusPolicy(t *testing.T) {
	h := requireHelm(t)
	e := startPolicyEnv(t, h)
	r := renderDefaults(t, h)
	ctx := policyCtx(t)
	policy, ok := findTyped[*admissionregistrationv1.ValidatingAdmissionPolicy](r, "ValidatingAdmissionPolicy", "", statusPolicyName)
	policyBinding, ok2 := findTyped[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](r, "ValidatingAdmissionPolicyBinding", "", statusPolicyName)
	if !ok || !ok2 {
		t.Fatal("the chart renders no ValidatingAdmissionPolicy and binding " + statusPolicyName)
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	_, err := e.admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{})
	must("create the node-status policy", err)
	_, err = e.admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, policyBinding, metav1.CreateOptions{})
	must("create the node-status policy's binding", err)
	const allNodeWrites = "test-every-node-write"
	_, err = e.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: allNodeWrites},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes", "nodes/status"}, Verbs: []string{"get", "create", "update", "patch", "delete"}}},
	}, metav1.CreateOptions{})
	must("create the test's ClusterRole", err)
	_, err = e.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: allNodeWrites},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: allNodeWrites},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: releaseName + "-scheduler", Namespace: releaseNamespace}},
	}, metav1.CreateOptions{})
	must("bind the test's ClusterRole", err)
	node, err := e.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{"topology.kubernetes.io/zone": "z1"}}}, metav1.CreateOptions{})
	must("create Node node-a", err)
	node.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
		{Type: vgpu.ConditionRegistered, Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered},
	}
	_, err = e.admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	must("set node-a's conditions", err)

	// The extender's own write: the node-condition controller's patch (extender/condition.go).
	stamp := time.Now().UTC().Format(time.RFC3339)
	ownPatch := `{"status":{"conditions":[{"type":"` + string(vgpu.ConditionRegistered) + `","status":"Unknown","reason":"` + vgpu.ReasonHeartbeatStale + `","message":"no heartbeat","lastHeartbeatTime":"` + stamp + `","lastTransitionTime":"` + stamp + `"}]}}`
	const statusDenial = "the gpuslice scheduler extender may change only the GPUSliceRegistered condition of a Node status, not another part of Node node-a/status"
	// The API server loads the policy from its informer: wait until it denies.
	// Each probe changes the reason: a patch that changes nothing is allowed.
	var last error
	probes := 0
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		probes++
		last = patchNodeStatus(ctx, e.extender, "node-a", fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Probe%d"}]}}`, probes))
		return last != nil && strings.Contains(last.Error(), statusDenial), nil
	}); err != nil {
		t.Fatalf("the chart's node-status policy never denied the extender changing the Ready condition: last answer %v", last)
	}

	tests := []struct {
		name     string
		do       func() error
		wantDeny string // "" means allowed
	}{
		{"its condition, as the extender patches it", func() error { return patchNodeStatus(ctx, e.extender, "node-a", ownPatch) }, ""},
		{"the Ready condition", func() error {
			return patchNodeStatus(ctx, e.extender, "node-a", `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"X"}]}}`)
		}, statusDenial},
		{"a new condition", func() error {
			return patchNodeStatus(ctx, e.extender, "node-a", `{"status":{"conditions":[{"type":"example.com/Other","status":"True","reason":"X"}]}}`)
		}, statusDenial},
		{"allocatable", func() error {
			return patchNodeStatus(ctx, e.extender, "node-a", `{"status":{"allocatable":{"`+string(vgpu.ResourceGPU)+`":"100"}}}`)
		}, statusDenial},
		{"addresses", func() error {
			return patchNodeStatus(ctx, e.extender, "node-a", `{"status":{"addresses":[{"type":"InternalIP","address":"10.0.0.9"}]}}`)
		}, statusDenial},
		{"a label through the status", func() error {
			return patchNodeStatus(ctx, e.extender, "node-a", `{"metadata":{"labels":{"topology.kubernetes.io/zone":"z2"}}}`)
		}, statusDenial},
		{"an annotation through the status", func() error {
			return patchNodeStatus(ctx, e.extender, "node-a", `{"metadata":{"annotations":{"`+vgpu.AnnotationNodeInventory+`":"{}"}}}`)
		}, statusDenial},
		{"the Node itself", func() error {
			return patchNode(ctx, e.extender, "node-a", `{"metadata":{"labels":{"topology.kubernetes.io/zone":"z2"}}}`)
		}, "the gpuslice scheduler extender may only update a Node status, not UPDATE Node node-a"},
		{"a new Node", func() error {
			_, err := e.extender.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-x"}}, metav1.CreateOptions{})
			return err
		}, "the gpuslice scheduler extender may only update a Node status, not CREATE Node node-x"},
		{"deleting the Node", func() error { return e.extender.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{}) },
			"the gpuslice scheduler extender may only update a Node status, not DELETE Node node-a"},
		{"the admin's Ready condition", func() error {
			return patchNodeStatus(ctx, e.admin, "node-a", `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady"}]}}`)
		}, ""},
	}
	for _, tt := range tests {
		checkAnswer(t, tt.name, tt.do(), tt.wantDeny)
	}
	got, err := e.admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	must("read node-a", err)
	if c, ok := vgpu.RegisteredCondition(got); !ok || c.Status != corev1.ConditionUnknown || c.Reason != vgpu.ReasonHeartbeatStale {
		t.Errorf("node-a's registration condition %+v, want the extender's Unknown %s", c, vgpu.ReasonHeartbeatStale)
	}
	if got.Labels["topology.kubernetes.io/zone"] != "z1" || len(got.Status.Conditions) != 2 || got.Status.Allocatable != nil {
		t.Errorf("node-a changed beyond its registration condition: labels %v, conditions %v, allocatable %v", got.Labels, got.Status.Conditions, got.Status.Allocatable)
	}
}

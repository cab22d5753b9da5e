package apiserver_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/test/harness/apiserver"
)

func TestServerStoresNodeAndLease(t *testing.T) {
	s := apiserver.Start(t, apiserver.Options{})
	client := kubernetes.NewForConfigOrDie(s.Config())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"gpuslice.io/test": "yes"}},
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	gotNode, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	if diff := cmp.Diff(node.Labels, gotNode.Labels); diff != "" {
		t.Errorf("node labels (-want +got):\n%s", diff)
	}
	// Admission really ran: the real API server taints every new Node as not ready.
	if !hasTaint(gotNode, corev1.TaintNodeNotReady) {
		t.Errorf("node taints = %v, want %s added by admission", gotNode.Spec.Taints, corev1.TaintNodeNotReady)
	}

	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: "n1"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To("n1"),
			LeaseDurationSeconds: ptr.To[int32](40),
		},
	}
	if _, err := client.CoordinationV1().Leases(lease.Namespace).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create lease: %v", err)
	}
	gotLease, err := client.CoordinationV1().Leases(lease.Namespace).Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	if diff := cmp.Diff(lease.Spec, gotLease.Spec); diff != "" {
		t.Errorf("lease spec (-want +got):\n%s", diff)
	}
}

// TestServerRestart starts a second server on the port and folder of a stopped one: a client made
// from a kubeconfig written before the restart reads what was stored before it.
func TestServerRestart(t *testing.T) {
	dir := t.TempDir()
	port := apiserver.FreePort(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	// Each call gets its own deadline: a start under load can take most of a
	// shared one.
	callCtx := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		return ctx
	}

	first := apiserver.Start(t, apiserver.Options{Port: port, Dir: dir})
	if err := first.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	if _, err := client.CoreV1().Nodes().Create(callCtx(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	first.Stop()
	first.Stop() // idempotent
	if _, err := client.CoreV1().Nodes().Get(callCtx(), "n1", metav1.GetOptions{}); err == nil {
		t.Fatalf("get node with the server stopped: got no error")
	}

	apiserver.Start(t, apiserver.Options{Port: port, Dir: dir})
	if _, err := client.CoreV1().Nodes().Get(callCtx(), "n1", metav1.GetOptions{}); err != nil {
		t.Errorf("get node after restart: %v", err)
	}
}

func hasTaint(node *corev1.Node, key string) bool {
	for _, taint := range node.Spec.Taints {
		if taint.Key == key {
			return true
		}
	}
	return false
}

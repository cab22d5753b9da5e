package deviceplugin

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/test/harness/apiserver"
)

// TestRESTAPI checks deviceplugin.NewAPI, the plugin's own REST client,
// against a real API server: every method, the API server's errors as they
// come, and NodePods filtered by the API server to the node's pods.
func TestRESTAPI(t *testing.T) {
	t.Parallel()
	s := apiserver.Start(t, apiserver.Options{})
	admin := kubernetes.NewForConfigOrDie(s.Config())
	api, err := deviceplugin.NewAPI(s.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := waitCtx(t, waitLong)
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, err := api.GetNode(ctx, "no-such-node"); !apierrors.IsNotFound(err) {
		t.Errorf("GetNode(no-such-node) error = %v, want NotFound", err)
	}
	node, err := api.PatchNode(ctx, nodeName, []byte(`{"metadata":{"labels":{"example.com/a":"b"}}}`), metav1.PatchOptions{FieldManager: "test"})
	if err != nil || node.Labels["example.com/a"] != "b" {
		t.Fatalf("PatchNode = labels %v, %v; want example.com/a=b", node.Labels, err)
	}
	if got, err := api.GetNode(ctx, nodeName); err != nil || got.UID != node.UID {
		t.Errorf("GetNode = UID %q, %v; want %q", got.UID, err, node.UID)
	}

	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: metav1.NamespaceDefault, Labels: map[string]string{"a": "b"}}}
	created, err := api.CreateLease(ctx, lease, metav1.CreateOptions{FieldManager: "test"})
	if err != nil {
		t.Fatal(err)
	}
	created.Spec.HolderIdentity = new("me")
	if _, err := api.UpdateLease(ctx, created, metav1.UpdateOptions{FieldManager: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.UpdateLease(ctx, created, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("UpdateLease with a stale resourceVersion error = %v, want Conflict", err)
	}
	got, err := api.GetLease(ctx, metav1.NamespaceDefault, "l")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"a": "b"}, got.Labels); diff != "" || got.Spec.HolderIdentity == nil || *got.Spec.HolderIdentity != "me" {
		t.Errorf("GetLease = labels (-want +got) %s, holder %v", diff, got.Spec.HolderIdentity)
	}

	event := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "e", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: metav1.NamespaceDefault, Name: "p"},
		Reason:         deviceplugin.ReasonAllocationMissing, Message: "m", Type: corev1.EventTypeWarning,
		Source: corev1.EventSource{Component: "gpuslice-device-plugin"}, Count: 1,
	}
	if _, err := api.CreateEvent(ctx, event); err != nil {
		t.Fatal(err)
	}
	if e, err := admin.CoreV1().Events(metav1.NamespaceDefault).Get(ctx, "e", metav1.GetOptions{}); err != nil || e.Reason != deviceplugin.ReasonAllocationMissing {
		t.Errorf("event written = %+v, %v", e, err)
	}

	pod := func(name, node string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}},
		}
	}
	for _, p := range []*corev1.Pod{pod("mine", nodeName), pod("other", "node-2")} {
		if _, err := admin.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	lw := cache.ToListerWatcherWithContext(api.NodePods(nodeName))
	list, err := lw.ListWithContext(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := list.(*corev1.PodList)
	if len(pods.Items) != 1 || pods.Items[0].Name != "mine" {
		t.Errorf("NodePods(%s) listed %d pods, want only mine: %+v", nodeName, len(pods.Items), pods.Items)
	}
	w, err := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: pods.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for _, p := range []*corev1.Pod{pod("other-2", "node-2"), pod("mine-2", nodeName)} {
		if _, err := admin.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case ev := <-w.ResultChan():
		if p, ok := ev.Object.(*corev1.Pod); ev.Type != watch.Added || !ok || p.Name != "mine-2" {
			t.Errorf("first watch event %s %T %v, want ADDED mine-2", ev.Type, ev.Object, ev.Object)
		}
	case <-ctx.Done():
		t.Fatal("no watch event for mine-2")
	}
}

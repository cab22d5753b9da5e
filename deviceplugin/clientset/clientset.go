package clientset

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// API implements deviceplugin.API with a clientset. Safe for concurrent
// use as the clientset is.
type API struct {
	client kubernetes.Interface
}

// New returns the API over client.
func New(client kubernetes.Interface) *API { return &API{client: client} }

// GetNode returns the Node name.
func (a *API) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return a.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

// PatchNode applies the JSON merge patch data to the Node name.
func (a *API) PatchNode(ctx context.Context, name string, data []byte, opts metav1.PatchOptions) (*corev1.Node, error) {
	return a.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, data, opts)
}

// PatchNodeStatus applies the strategic merge patch data to the status of
// the Node name.
func (a *API) PatchNodeStatus(ctx context.Context, name string, data []byte, opts metav1.PatchOptions) (*corev1.Node, error) {
	return a.client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, data, opts, "status")
}

// GetLease returns the Lease namespace/name.
func (a *API) GetLease(ctx context.Context, namespace, name string) (*coordinationv1.Lease, error) {
	return a.client.CoordinationV1().Leases(namespace).Get(ctx, name, metav1.GetOptions{})
}

// CreateLease creates lease in lease.Namespace.
func (a *API) CreateLease(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	return a.client.CoordinationV1().Leases(lease.Namespace).Create(ctx, lease, opts)
}

// UpdateLease replaces lease.
func (a *API) UpdateLease(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	return a.client.CoordinationV1().Leases(lease.Namespace).Update(ctx, lease, opts)
}

// NodePods lists and watches the pods whose spec.nodeName is node. A real
// API server filters them; client-go's fake clientset ignores field
// selectors, so callers must check spec.nodeName themselves. The informer
// streams its first listing only where the clientset supports that (the
// fake does not).
func (a *API) NodePods(node string) cache.ListerWatcher {
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	pods := a.client.CoreV1().Pods(metav1.NamespaceAll)
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = sel
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = sel
			return pods.Watch(ctx, opts)
		},
	}, a.client)
}

// CreateEvent creates event in event.Namespace.
func (a *API) CreateEvent(ctx context.Context, event *corev1.Event) (*corev1.Event, error) {
	return a.client.CoreV1().Events(event.Namespace).Create(ctx, event, metav1.CreateOptions{})
}

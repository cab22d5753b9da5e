package clientset

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	publishclient "github.com/gpuslice/gpuslice/node/publish/clientset"
)

// API implements deviceplugin.API with a clientset: the Node and Lease
// methods of publish's, plus the pods and events. Safe for concurrent use
// as the clientset is.
type API struct {
	*publishclient.API
	client kubernetes.Interface
}

// New returns the API over client.
func New(client kubernetes.Interface) *API {
	return &API{API: publishclient.New(client), client: client}
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

// Pod implements deviceplugin.API.
func (a *API) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return a.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

// CreateEvent creates event in event.Namespace.
func (a *API) CreateEvent(ctx context.Context, event *corev1.Event) (*corev1.Event, error) {
	return a.client.CoreV1().Events(event.Namespace).Create(ctx, event, metav1.CreateOptions{})
}

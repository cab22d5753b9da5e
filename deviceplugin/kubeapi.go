package deviceplugin

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuslice/gpuslice/node/publish"
)

// API is the plugin's access to the Kubernetes API server: its own Node,
// its heartbeat Lease, the pods bound to its node and the events it
// records. NewAPI returns the real one; package
// deviceplugin/clientset adapts a client-go clientset (client-go's fake in
// tests). Methods are safe for concurrent use and return the API server's
// errors as they come, so that apierrors.IsNotFound and the like work on
// them.
type API interface {
	// The Node and the heartbeat Lease, for the publisher.
	publish.API
	// NodePods lists and watches, for an informer, the pods in every
	// namespace whose spec.nodeName is node. The API server filters them.
	NodePods(node string) cache.ListerWatcher
	// Pod reads one pod: a consistent read, as a GET without a resource
	// version is.
	Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// CreateEvent creates event in event.Namespace.
	CreateEvent(ctx context.Context, event *corev1.Event) (*corev1.Event, error)
}

// restAPI is the real API: two REST clients (the core group and
// coordination.k8s.io/v1) over one HTTP client, speaking protobuf, with a
// scheme that holds only those groups. The plugin thus links neither
// client-go's clientset nor its scheme of every built-in API group, which
// were most of the binary's code and of its resident memory.
type restAPI struct {
	core, leases *rest.RESTClient
}

// clientQPS and clientBurst are the API client's limits when cfg sets
// none: the kubelet's defaults (kubeAPIQPS, kubeAPIBurst).
const (
	clientQPS   = 50
	clientBurst = 100
)

// NewAPI returns the API over cfg. It makes no request. A cfg without
// client limits gets clientQPS and clientBurst.
func NewAPI(cfg *rest.Config) (API, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("API scheme: %w", err)
	}
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("API scheme: %w", err)
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	codecs := serializer.NewCodecFactory(scheme).WithoutConversion()
	client := func(apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
		c := rest.CopyConfig(cfg)
		if c.QPS == 0 && c.Burst == 0 && c.RateLimiter == nil {
			// The kubelet's own client limits, not client-go's 5/10: each
			// container start confirms its pod with one read of it, and a
			// burst of 40 starts on one node would otherwise queue behind
			// the limiter for seconds.
			c.QPS, c.Burst = clientQPS, clientBurst
		}
		c.APIPath = apiPath
		c.GroupVersion = &gv
		c.NegotiatedSerializer = codecs
		// Protobuf, as the kubelet speaks: decoding a Pod from JSON builds
		// and keeps a reflection cache of every struct in it.
		if c.ContentType == "" {
			c.ContentType = runtime.ContentTypeProtobuf
			c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
		}
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		rc, err := rest.RESTClientForConfigAndClient(c, httpClient)
		if err != nil {
			return nil, fmt.Errorf("API client for %s: %w", gv, err)
		}
		return rc, nil
	}
	a := &restAPI{}
	if a.core, err = client("/api", corev1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if a.leases, err = client("/apis", coordinationv1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	return a, nil
}

// GetNode implements API.
func (a *restAPI) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	node := &corev1.Node{}
	err := a.core.Get().Resource("nodes").Name(name).Do(ctx).Into(node)
	return node, err
}

// PatchNode implements API.
func (a *restAPI) PatchNode(ctx context.Context, name string, data []byte, opts metav1.PatchOptions) (*corev1.Node, error) {
	node := &corev1.Node{}
	err := a.core.Patch(types.MergePatchType).Resource("nodes").Name(name).
		VersionedParams(&opts, metav1.ParameterCodec).Body(data).Do(ctx).Into(node)
	return node, err
}

// PatchNodeStatus implements API.
func (a *restAPI) PatchNodeStatus(ctx context.Context, name string, data []byte, opts metav1.PatchOptions) (*corev1.Node, error) {
	node := &corev1.Node{}
	err := a.core.Patch(types.StrategicMergePatchType).Resource("nodes").Name(name).SubResource("status").
		VersionedParams(&opts, metav1.ParameterCodec).Body(data).Do(ctx).Into(node)
	return node, err
}

// GetLease implements API.
func (a *restAPI) GetLease(ctx context.Context, namespace, name string) (*coordinationv1.Lease, error) {
	lease := &coordinationv1.Lease{}
	err := a.leases.Get().Namespace(namespace).Resource("leases").Name(name).Do(ctx).Into(lease)
	return lease, err
}

// CreateLease implements API.
func (a *restAPI) CreateLease(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := a.leases.Post().Namespace(lease.Namespace).Resource("leases").
		VersionedParams(&opts, metav1.ParameterCodec).Body(lease).Do(ctx).Into(out)
	return out, err
}

// UpdateLease implements API.
func (a *restAPI) UpdateLease(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := a.leases.Put().Namespace(lease.Namespace).Resource("leases").Name(lease.Name).
		VersionedParams(&opts, metav1.ParameterCodec).Body(lease).Do(ctx).Into(out)
	return out, err
}

// NodePods implements API.
func (a *restAPI) NodePods(node string) cache.ListerWatcher {
	return cache.NewListWatchFromClient(a.core, "pods", metav1.NamespaceAll, fields.OneTermEqualSelector("spec.nodeName", node))
}

// Pod implements API.
func (a *restAPI) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	err := a.core.Get().Namespace(namespace).Resource("pods").Name(name).Do(ctx).Into(out)
	return out, err
}

// CreateEvent implements API.
func (a *restAPI) CreateEvent(ctx context.Context, event *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := a.core.Post().Namespace(event.Namespace).Resource("events").Body(event).Do(ctx).Into(out)
	return out, err
}

package deviceplugin

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// podSource is the plugin's view of the pods bound to its node. Pods are
// shared with the cache: callers must not modify them.
type podSource interface {
	// Pod returns the pod namespace/name as last seen, or false.
	Pod(namespace, name string) (*corev1.Pod, bool)
	// Pods returns every pod bound to the node, in no particular order.
	Pods() []*corev1.Pod
	// Changed returns a channel that is closed at the next change of any
	// pod (and once the first listing is complete).
	Changed() <-chan struct{}
	// HasSynced reports whether the first listing is complete.
	HasSynced() bool
}

// podView is the real podSource: a client-go informer on the pods with
// spec.nodeName=<node>. It costs one watch per node and no API call per
// container start.
type podView struct {
	node     string
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	lister   corelisters.PodLister

	mu      sync.Mutex
	changed chan struct{}
}

// newPodView prepares the informer; start runs it.
func newPodView(client kubernetes.Interface, node string) (*podView, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
	pods := factory.Core().V1().Pods()
	v := &podView{node: node, factory: factory, informer: pods.Informer(), lister: pods.Lister(), changed: make(chan struct{})}
	// Managed fields are the bulk of a pod object and of no use here.
	if err := v.informer.SetTransform(func(obj any) (any, error) {
		if pod, ok := obj.(*corev1.Pod); ok {
			pod.ManagedFields = nil
		}
		return obj, nil
	}); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	notify := func(any) { v.notify() }
	if _, err := v.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, _ any) { v.notify() },
		DeleteFunc: notify,
	}); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	return v, nil
}

// start runs the informer until ctx ends; stop waits for it afterwards.
func (v *podView) start(ctx context.Context) {
	v.factory.Start(ctx.Done())
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), v.informer.HasSynced) {
			v.notify()
		}
	}()
}

// stop waits for the informer's goroutines once start's ctx has ended.
func (v *podView) stop() { v.factory.Shutdown() }

func (v *podView) notify() {
	v.mu.Lock()
	defer v.mu.Unlock()
	close(v.changed)
	v.changed = make(chan struct{})
}

// Changed implements podSource.
func (v *podView) Changed() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.changed
}

// HasSynced implements podSource.
func (v *podView) HasSynced() bool { return v.informer.HasSynced() }

// Pod implements podSource.
func (v *podView) Pod(namespace, name string) (*corev1.Pod, bool) {
	pod, err := v.lister.Pods(namespace).Get(name)
	if err != nil || pod.Spec.NodeName != v.node {
		return nil, false
	}
	return pod, true
}

// Pods implements podSource.
func (v *podView) Pods() []*corev1.Pod {
	all, err := v.lister.List(labels.Everything())
	if err != nil {
		return nil
	}
	pods := all[:0:0]
	for _, p := range all {
		if p.Spec.NodeName == v.node {
			pods = append(pods, p)
		}
	}
	return pods
}

package deviceplugin

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuslice/gpuslice/vgpu"
)

// podSource is the plugin's view of the pods bound to its node. Pods are
// shared with the cache: callers must not modify them.
type podSource interface {
	// Pod returns the pod namespace/name as last seen, or false.
	Pod(namespace, name string) (*corev1.Pod, bool)
	// Pods returns every pod bound to the node, in no particular order.
	Pods() []*corev1.Pod
	// Allocation returns pod's vgpu.AnnotationPodAllocation parsed, with
	// ok false when pod has none. The result is shared: callers must not
	// modify it.
	Allocation(pod *corev1.Pod) (alloc vgpu.PodAllocation, ok bool, err error)
	// Changed returns a channel that is closed at the next change of any
	// pod (and once the first listing is complete).
	Changed() <-chan struct{}
	// HasSynced reports whether the first listing is complete.
	HasSynced() bool
}

// podView is the real podSource: an informer on the pods with
// spec.nodeName=<node> (API.NodePods). It costs one watch per node and no
// API call per container start, and parses each pod's allocation once per
// pod update.
type podView struct {
	node     string
	informer cache.SharedIndexInformer
	lister   corelisters.PodLister
	done     chan struct{} // closed when the informer has stopped; nil before start

	mu      sync.Mutex
	changed chan struct{}
	allocs  map[types.UID]parsedAllocation // filled by the event handlers
}

// parsedAllocation is a pod's allocation annotation value and its parse.
type parsedAllocation struct {
	value string
	alloc vgpu.PodAllocation
	err   error
}

// newPodView prepares the informer on lw, which lists and watches the
// pods bound to node; start runs it.
func newPodView(lw cache.ListerWatcher, node string) (*podView, error) {
	informer := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	v := &podView{node: node, informer: informer, lister: corelisters.NewPodLister(informer.GetIndexer()),
		changed: make(chan struct{}), allocs: map[types.UID]parsedAllocation{}}
	// Managed fields are the bulk of a pod object and of no use here.
	if err := v.informer.SetTransform(func(obj any) (any, error) {
		if pod, ok := obj.(*corev1.Pod); ok {
			pod.ManagedFields = nil
		}
		return obj, nil
	}); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	if _, err := v.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    v.onUpdate,
		UpdateFunc: func(_, obj any) { v.onUpdate(obj) },
		DeleteFunc: v.onDelete,
	}); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	return v, nil
}

// start runs the informer until ctx ends; stop waits for it afterwards.
// Call start once.
func (v *podView) start(ctx context.Context) {
	v.done = make(chan struct{})
	go func() {
		defer close(v.done)
		v.informer.RunWithContext(ctx)
	}()
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), v.informer.HasSynced) {
			v.notify()
		}
	}()
}

// stop waits for the informer to return once start's ctx has ended.
func (v *podView) stop() {
	if v.done != nil {
		<-v.done
	}
}

func (v *podView) notify() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.notifyLocked()
}

// notifyLocked wakes the waiters on Changed; v.mu must be held.
func (v *podView) notifyLocked() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// onUpdate keeps an added or updated pod's parsed allocation, parsing
// only a value not seen before for that pod, and wakes the waiters.
func (v *podView) onUpdate(obj any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if pod, ok := obj.(*corev1.Pod); ok {
		value, has := pod.Annotations[vgpu.AnnotationPodAllocation]
		if old, cached := v.allocs[pod.UID]; !has {
			delete(v.allocs, pod.UID)
		} else if !cached || old.value != value {
			alloc, err := vgpu.ParsePodAllocation(value)
			v.allocs[pod.UID] = parsedAllocation{value: value, alloc: alloc, err: err}
		}
	}
	v.notifyLocked()
}

// onDelete forgets a deleted pod's allocation and wakes the waiters.
func (v *podView) onDelete(obj any) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if pod, ok := obj.(*corev1.Pod); ok {
		delete(v.allocs, pod.UID)
	}
	v.notifyLocked()
}

// Allocation implements podSource. A pod the handlers have not seen yet
// (the lister is updated a moment before them) is parsed on the spot.
func (v *podView) Allocation(pod *corev1.Pod) (vgpu.PodAllocation, bool, error) {
	value, ok := pod.Annotations[vgpu.AnnotationPodAllocation]
	if !ok {
		return vgpu.PodAllocation{}, false, nil
	}
	v.mu.Lock()
	p, parsed := v.allocs[pod.UID]
	v.mu.Unlock()
	if parsed && p.value == value {
		return p.alloc, true, p.err
	}
	alloc, err := vgpu.ParsePodAllocation(value)
	return alloc, true, err
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

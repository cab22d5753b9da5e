package extender

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"

	"github.com/gpuslice/gpuslice/extender/cluster"
)

// podMeta is what the pod cache keeps of a pod that asks for no hami.io
// resource and carries no annotation the extender reads — most pods of a cluster: its
// identity, and what it takes of its node's CPU and memory, which the
// fragmentation policy weighs (a GPU whose node has no CPU left for the
// tasks that could use it is as good as taken). It is a runtime.Object only
// to live in the informer's store, and keeps its identity in plain fields
// rather than a metav1.ObjectMeta, which would triple its size: the store
// reads the identity through GetObjectMeta (meta.Accessor).
type podMeta struct {
	Name, Namespace string
	UID             types.UID
	ResourceVersion string
	// NodeName is the node the pod is bound to ("" while pending);
	// Terminal is true once it Succeeded or Failed.
	NodeName string
	Terminal bool
	// Host is vgpu.HostRequestOf the pod.
	Host vgpu.HostResources
	// Claims is true when the pod names resource claims (spec.resourceClaims).
	Claims bool
}

// GetObjectKind is that of an object without type information.
func (p *podMeta) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies p.
func (p *podMeta) DeepCopyObject() runtime.Object {
	c := *p
	return &c
}

// GetObjectMeta returns p's identity as an ObjectMeta, built on each call.
func (p *podMeta) GetObjectMeta() metav1.Object { return p.objectMeta() }

func (p *podMeta) objectMeta() *metav1.ObjectMeta {
	return &metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion}
}

// metaOf is the trimmer's podMeta of pod.
func metaOf(pod *corev1.Pod) *podMeta {
	return &podMeta{
		Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		NodeName: pod.Spec.NodeName,
		Terminal: cluster.Terminal(pod.Status.Phase),
		Host:     vgpu.HostRequestOf(pod),
		Claims:   len(pod.Spec.ResourceClaims) > 0,
	}
}

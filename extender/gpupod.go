package extender

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// gpuPod is what the pod cache keeps of a pod that asks for a hami.io
// resource or carries annotations the extender reads: what Bind, the usage count and
// the online workload read of it. A trimmed corev1.Pod kept the same fields
// in 1.3 KB, most of it the empty fields of its spec and status, and 400
// bytes more per container; this keeps them in about a fifth, which at
// thousands of GPU pods is megabytes of heap, twice that of RSS at Go's
// default collection target. The readers take the pod back as a
// corev1.Pod (pod), built on each call: they read it once per event or
// bind. Like podMeta it is a runtime.Object only to live in the
// informer's store, which reads its identity through GetObjectMeta.
type gpuPod struct {
	Name, Namespace string
	UID             types.UID
	ResourceVersion string
	// Annotations are the pod's annotations the extender reads, bounded
	// (keepAnnotations).
	Annotations       map[string]string
	DeletionTimestamp *metav1.Time
	NodeName          string
	Phase             corev1.PodPhase
	Overhead          corev1.ResourceList
	ResourceClaims    []corev1.PodResourceClaim
	InitContainers    []gpuContainer
	Containers        []gpuContainer
}

// gpuContainer is what gpuPod keeps of a container.
type gpuContainer struct {
	Name          string
	Resources     corev1.ResourceRequirements
	RestartPolicy *corev1.ContainerRestartPolicy
}

// gpuPodOf is the trimmer's gpuPod of pod, with annotations those of
// keepAnnotations. It shares pod's maps and slices, which the informer's
// decoded object no longer needs.
func gpuPodOf(pod *corev1.Pod, annotations map[string]string) *gpuPod {
	return &gpuPod{
		Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		Annotations: annotations, DeletionTimestamp: pod.DeletionTimestamp,
		NodeName: pod.Spec.NodeName, Phase: pod.Status.Phase,
		Overhead: pod.Spec.Overhead, ResourceClaims: pod.Spec.ResourceClaims,
		InitContainers: gpuContainersOf(pod.Spec.InitContainers),
		Containers:     gpuContainersOf(pod.Spec.Containers),
	}
}

func gpuContainersOf(cs []corev1.Container) []gpuContainer {
	if cs == nil {
		return nil
	}
	out := make([]gpuContainer, len(cs))
	for i, c := range cs {
		out[i] = gpuContainer{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
	}
	return out
}

// pod returns p as a corev1.Pod with the fields p keeps; it shares p's
// maps and slices, which callers only read.
func (p *gpuPod) pod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: *p.objectMeta(),
		Spec: corev1.PodSpec{
			NodeName: p.NodeName, Overhead: p.Overhead, ResourceClaims: p.ResourceClaims,
			InitContainers: containersOf(p.InitContainers),
			Containers:     containersOf(p.Containers),
		},
		Status: corev1.PodStatus{Phase: p.Phase},
	}
}

func containersOf(cs []gpuContainer) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
	}
	return out
}

// GetObjectKind is that of an object without type information.
func (p *gpuPod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies p, its maps and slices included.
func (p *gpuPod) DeepCopyObject() runtime.Object {
	c := *p
	full := p.pod().DeepCopy()
	c.Annotations = full.Annotations
	c.DeletionTimestamp = full.DeletionTimestamp
	c.Overhead = full.Spec.Overhead
	c.ResourceClaims = full.Spec.ResourceClaims
	c.InitContainers = gpuContainersOf(full.Spec.InitContainers)
	c.Containers = gpuContainersOf(full.Spec.Containers)
	return &c
}

// GetObjectMeta returns p's identity and annotations as an ObjectMeta,
// built on each call.
func (p *gpuPod) GetObjectMeta() metav1.Object { return p.objectMeta() }

func (p *gpuPod) objectMeta() *metav1.ObjectMeta {
	return &metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
		Annotations: p.Annotations, DeletionTimestamp: p.DeletionTimestamp,
	}
}

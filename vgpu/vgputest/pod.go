package vgputest

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"
)

// PodBuilder builds a *corev1.Pod. Start with Pod. Resource setters apply to
// the last container added (init or app); when there is none they first add
// an app container named "main".
type PodBuilder struct {
	pod corev1.Pod
	// lastInit and lastIndex locate the last container added in
	// InitContainers or Containers; lastIndex is -1 while there is none.
	lastInit  bool
	lastIndex int
}

// Pod starts a pod in namespace "default" with UID "uid-"+name and no
// containers.
func Pod(name string) *PodBuilder {
	return &PodBuilder{
		pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: metav1.NamespaceDefault, UID: types.UID("uid-" + name),
		}},
		lastIndex: -1,
	}
}

// Namespace sets the pod's namespace.
func (b *PodBuilder) Namespace(ns string) *PodBuilder {
	b.pod.Namespace = ns
	return b
}

// Annotation sets an annotation.
func (b *PodBuilder) Annotation(key, value string) *PodBuilder {
	if b.pod.Annotations == nil {
		b.pod.Annotations = map[string]string{}
	}
	b.pod.Annotations[key] = value
	return b
}

// NodeName sets spec.nodeName, as a bound pod has.
func (b *PodBuilder) NodeName(node string) *PodBuilder {
	b.pod.Spec.NodeName = node
	return b
}

// NodeSelector sets one spec.nodeSelector label.
func (b *PodBuilder) NodeSelector(key, value string) *PodBuilder {
	if b.pod.Spec.NodeSelector == nil {
		b.pod.Spec.NodeSelector = map[string]string{}
	}
	b.pod.Spec.NodeSelector[key] = value
	return b
}

// Container adds an app container with image "busybox".
func (b *PodBuilder) Container(name string) *PodBuilder {
	b.pod.Spec.Containers = append(b.pod.Spec.Containers, corev1.Container{Name: name, Image: "busybox"})
	b.lastInit, b.lastIndex = false, len(b.pod.Spec.Containers)-1
	return b
}

// InitContainer adds a regular (run-to-completion) init container.
func (b *PodBuilder) InitContainer(name string) *PodBuilder {
	b.pod.Spec.InitContainers = append(b.pod.Spec.InitContainers, corev1.Container{Name: name, Image: "busybox"})
	b.lastInit, b.lastIndex = true, len(b.pod.Spec.InitContainers)-1
	return b
}

// Sidecar adds a restartable init container (restartPolicy Always).
func (b *PodBuilder) Sidecar(name string) *PodBuilder {
	b.InitContainer(name)
	always := corev1.ContainerRestartPolicyAlways
	b.current().RestartPolicy = &always
	return b
}

// GPU sets the hami.io/gpu limit.
func (b *PodBuilder) GPU(n int) *PodBuilder {
	return b.Limit(vgpu.ResourceGPU, strconv.Itoa(n))
}

// MemoryMiB sets the hami.io/gpumem limit to a plain number of MiB.
func (b *PodBuilder) MemoryMiB(mib int64) *PodBuilder {
	return b.Limit(vgpu.ResourceMemory, strconv.FormatInt(mib, 10))
}

// MemoryPercent sets the hami.io/gpumem-percentage limit.
func (b *PodBuilder) MemoryPercent(percent int) *PodBuilder {
	return b.Limit(vgpu.ResourceMemoryPercentage, strconv.Itoa(percent))
}

// Cores sets the hami.io/gpucores limit.
func (b *PodBuilder) Cores(percent int) *PodBuilder {
	return b.Limit(vgpu.ResourceCores, strconv.Itoa(percent))
}

// Limit sets a limit from a quantity string such as "10Gi"; use it for
// values the API accepts but vgpu rejects. A string that is not a quantity
// is a mistake in the test and panics (resource.MustParse).
func (b *PodBuilder) Limit(name corev1.ResourceName, quantity string) *PodBuilder {
	c := b.current()
	c.Resources.Limits = setQuantity(c.Resources.Limits, name, quantity)
	return b
}

// Request sets a request from a quantity string, like Limit.
func (b *PodBuilder) Request(name corev1.ResourceName, quantity string) *PodBuilder {
	c := b.current()
	c.Resources.Requests = setQuantity(c.Resources.Requests, name, quantity)
	return b
}

// Obj returns a deep copy of the pod built so far.
func (b *PodBuilder) Obj() *corev1.Pod {
	return b.pod.DeepCopy()
}

func (b *PodBuilder) current() *corev1.Container {
	if b.lastIndex < 0 {
		b.Container("main")
	}
	if b.lastInit {
		return &b.pod.Spec.InitContainers[b.lastIndex]
	}
	return &b.pod.Spec.Containers[b.lastIndex]
}

func setQuantity(list corev1.ResourceList, name corev1.ResourceName, quantity string) corev1.ResourceList {
	q := resource.MustParse(quantity)
	if list == nil {
		list = corev1.ResourceList{}
	}
	list[name] = q
	return list
}

// PodRequest returns the vgpu.PodRequest of the pod built so far; a pod that
// vgpu rejects is a mistake in the test and panics.
func (b *PodBuilder) PodRequest() vgpu.PodRequest {
	r, err := vgpu.RequestFromPod(&b.pod)
	if err != nil {
		panic(err)
	}
	return r
}

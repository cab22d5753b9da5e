package vgpu

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ContainerRequest is what one container asks for, per GPU, after defaults.
// RequestFromPod guarantees: GPUs is 1 to MaxGPUsPerContainer; exactly one of
// MemoryMiB and MemoryPercent is above 0; CoresPercent is 0 to 100.
type ContainerRequest struct {
	// Name is the container's name.
	Name string
	// Init is true for an init container, restartable (sidecar) or not.
	Init bool
	// Sidecar is true for an init container with restartPolicy Always: it
	// keeps its GPUs while the app containers run.
	Sidecar bool
	// GPUs is how many distinct physical GPUs the container gets a slice of.
	GPUs int
	// MemoryMiB is the memory of each slice, or 0 when MemoryPercent is set.
	MemoryMiB int64
	// MemoryPercent is the memory of each slice as a percent of the GPU's
	// SchedulableMemoryMiB, or 0 when MemoryMiB is set. A container that
	// sets neither gets 100.
	MemoryPercent int
	// CoresPercent is the compute reserved on each GPU. 0 means none is
	// reserved and the slice is not throttled (it shares what is free).
	CoresPercent int
	// Exclusive is true when the container set only ResourceGPU: it gets
	// whole GPUs that no other slice shares (MemoryPercent and CoresPercent
	// are then 100).
	Exclusive bool
	// UUIDs, when not empty, are the only GPUs the container may take,
	// besides the pod's Constraints: a DRA request's device selectors,
	// evaluated by the caller on one node's devices. RequestFromPod leaves
	// it empty.
	UUIDs []string
}

// PodRequest is what a pod asks for: one entry per container that sets any
// of the Resources, init containers first, each group in spec order. No
// entries means the pod wants no GPU.
type PodRequest struct {
	Containers []ContainerRequest
}

// RequestError is one invalid GPU resource value in a pod spec. Callers find
// it with errors.As; RequestFromPod joins one per problem.
type RequestError struct {
	// Container is the container's name.
	Container string
	// Init is true when the container is an init container.
	Init bool
	// Resource is the resource name, e.g. "hami.io/gpucores".
	Resource string
	// Value is the value as the API renders it, e.g. "150" or "10Gi".
	Value string
	// Allowed says what would be accepted, as a phrase that follows the
	// value, e.g. "must be an integer from 1 to 100".
	Allowed string
}

// Error renders e as `container "train": hami.io/gpucores=150: must be an
// integer from 1 to 100`.
func (e *RequestError) Error() string {
	kind := "container"
	if e.Init {
		kind = "init container"
	}
	return fmt.Sprintf("%s %q: %s=%s: %s", kind, e.Container, e.Resource, e.Value, e.Allowed)
}

// IsSidecar reports whether init container c is a sidecar: restartPolicy
// Always, so it runs beside the app containers instead of before them.
func IsSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// RequestFromPod reads what each container and init container of pod asks
// for. It reads limits, or requests where limits lack the resource; when both
// have it they must be equal. Rules:
//   - ResourceGPU is an integer from 1 to MaxGPUsPerContainer; a container
//     that sets any other of the Resources without it gets 1.
//   - ResourceMemory is a plain number of MiB, or bytes when written with a
//     binary suffix (Ki, Mi, Gi, …) that must come to a whole MiB; from 1 to
//     MaxMemoryMiB either way. (The API server renders a byte quantity that
//     is not a whole KiB, such as 1.5Ki, as a plain number; that then reads
//     as MiB.)
//   - ResourceMemoryPercentage and ResourceCores are integers from 1 to 100.
//   - ResourceMemory and ResourceMemoryPercentage exclude each other.
//   - ResourceGPU alone means whole GPUs (Exclusive).
//   - At most MaxGPUContainersPerPod containers and init containers ask
//     for GPUs; the first one over is reported, and the containers after
//     it are not read.
//
// On any violation it returns a zero PodRequest and every problem at once,
// joined with errors.Join, each a *RequestError, in container order then
// Resources order. A nil pod is an error. It is pure and safe to call
// concurrently.
func RequestFromPod(pod *corev1.Pod) (PodRequest, error) {
	if pod == nil {
		return PodRequest{}, errors.New("vgpu: RequestFromPod: nil pod")
	}
	var req PodRequest
	var errs []error
	gpuContainers := 0
	add := func(res corev1.ResourceRequirements, c ContainerRequest, ok bool, cerrs []error) {
		errs = append(errs, cerrs...)
		if !ok {
			return
		}
		if gpuContainers++; gpuContainers == MaxGPUContainersPerPod+1 {
			name, q := firstResource(res)
			errs = append(errs, &RequestError{Container: c.Name, Init: c.Init, Resource: string(name), Value: q.String(), Allowed: fmt.Sprintf(
				"a pod may have at most %d containers and init containers that ask for GPUs, and this is one more", MaxGPUContainersPerPod)})
		}
		if len(cerrs) == 0 {
			req.Containers = append(req.Containers, c)
		}
	}
	for i := 0; i < len(pod.Spec.InitContainers) && gpuContainers <= MaxGPUContainersPerPod; i++ {
		c := &pod.Spec.InitContainers[i]
		r, ok, cerrs := containerRequest(ContainerRequest{Name: c.Name, Init: true, Sidecar: IsSidecar(c)}, c.Resources)
		add(c.Resources, r, ok, cerrs)
	}
	for i := 0; i < len(pod.Spec.Containers) && gpuContainers <= MaxGPUContainersPerPod; i++ {
		c := &pod.Spec.Containers[i]
		r, ok, cerrs := containerRequest(ContainerRequest{Name: c.Name}, c.Resources)
		add(c.Resources, r, ok, cerrs)
	}
	if len(errs) > 0 {
		return PodRequest{}, errors.Join(errs...)
	}
	return req, nil
}

// containerRequest fills r from res. ok is false when the container sets
// none of the Resources.
func containerRequest(r ContainerRequest, res corev1.ResourceRequirements) (ContainerRequest, bool, []error) {
	var errs []error
	fail := func(name corev1.ResourceName, q resource.Quantity, allowed string) {
		errs = append(errs, &RequestError{
			Container: r.Name, Init: r.Init, Resource: string(name), Value: q.String(), Allowed: allowed,
		})
	}
	set := map[corev1.ResourceName]resource.Quantity{}
	for _, name := range Resources() {
		limit, hasLimit := res.Limits[name]
		request, hasRequest := res.Requests[name]
		switch {
		case hasLimit && hasRequest && !limit.Equal(request):
			fail(name, limit, fmt.Sprintf("must equal its request (%s): an extended resource's request and limit must be equal", request.String()))
			set[name] = limit
		case hasLimit:
			set[name] = limit
		case hasRequest:
			set[name] = request
		}
	}
	if len(set) == 0 {
		return r, false, nil
	}
	r.GPUs = 1
	if q, ok := set[ResourceGPU]; ok {
		n, valid := integerInRange(q, MaxGPUsPerContainer)
		if !valid {
			fail(ResourceGPU, q, fmt.Sprintf("must be an integer from 1 to %d", MaxGPUsPerContainer))
		}
		r.GPUs = int(n)
	}
	memory, hasMemory := set[ResourceMemory]
	if hasMemory {
		mib, valid := memoryMiB(memory)
		if !valid {
			fail(ResourceMemory, memory, fmt.Sprintf("must be a whole number of MiB from 1 to %d: a plain number is MiB (10240), a binary suffix means bytes (10Gi)", MaxMemoryMiB))
		}
		r.MemoryMiB = mib
	}
	percent, hasPercent := set[ResourceMemoryPercentage]
	if hasPercent {
		n, valid := integerInRange(percent, MaxPercent)
		if !valid {
			fail(ResourceMemoryPercentage, percent, fmt.Sprintf("must be an integer from 1 to %d", MaxPercent))
		}
		r.MemoryPercent = int(n)
	}
	if hasMemory && hasPercent {
		fail(ResourceMemory, memory, fmt.Sprintf("must not be set together with %s (%s): set one of them", ResourceMemoryPercentage, percent.String()))
	}
	cores, hasCores := set[ResourceCores]
	if hasCores {
		n, valid := integerInRange(cores, MaxPercent)
		if !valid {
			fail(ResourceCores, cores, fmt.Sprintf("must be an integer from 1 to %d", MaxPercent))
		}
		r.CoresPercent = int(n)
	}
	switch {
	case !hasMemory && !hasPercent && !hasCores:
		r.Exclusive, r.MemoryPercent, r.CoresPercent = true, MaxPercent, MaxPercent
	case !hasMemory && !hasPercent:
		r.MemoryPercent = MaxPercent
	}
	return r, true, errs
}

// firstResource returns the first of Resources that res sets, in its limits
// or else its requests.
func firstResource(res corev1.ResourceRequirements) (corev1.ResourceName, resource.Quantity) {
	for _, name := range Resources() {
		if q, ok := res.Limits[name]; ok {
			return name, q
		}
		if q, ok := res.Requests[name]; ok {
			return name, q
		}
	}
	return "", resource.Quantity{}
}

// integerInRange returns q as an integer when it is one from 1 to upper.
func integerInRange(q resource.Quantity, upper int64) (int64, bool) {
	if q.Sign() <= 0 || q.Cmp(*resource.NewQuantity(upper, resource.DecimalSI)) > 0 {
		return 0, false
	}
	v := q.Value() // rounds up; fits, as q <= upper
	if q.Cmp(*resource.NewQuantity(v, resource.DecimalSI)) != 0 {
		return 0, false
	}
	return v, true
}

// memoryMiB reads a ResourceMemory quantity: bytes when q has a binary
// suffix, else MiB.
func memoryMiB(q resource.Quantity) (int64, bool) {
	if q.Format != resource.BinarySI {
		return integerInRange(q, MaxMemoryMiB)
	}
	bytes, ok := integerInRange(q, MaxMemoryMiB<<20)
	if !ok || bytes%(1<<20) != 0 {
		return 0, false
	}
	return bytes >> 20, true
}

// AsksForGPU reports whether any container or init container of pod names
// a hami.io/ resource in its limits or requests: whether gpuslice has any
// business with it. It does not check the values (RequestFromPod does).
func AsksForGPU(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for _, list := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
				for name := range list {
					if strings.HasPrefix(string(name), AnnotationPrefix) {
						return true
					}
				}
			}
		}
	}
	return false
}

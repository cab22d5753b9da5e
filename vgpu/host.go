package vgpu

import (
	corev1 "k8s.io/api/core/v1"
)

// HostRequestOf returns the CPU and host memory pod takes of its node, as kube-scheduler counts
// them: its app containers' and restartable init containers' (sidecars') requests summed, or an
// init container's request beside the sidecars started before it if that is more, plus the
// pod's overhead. A container without a request counts its limit, as the API server defaults
// it; memory is rounded up to whole MiB. It is pure and never fails: what cannot be read
// counts 0.
func HostRequestOf(pod *corev1.Pod) HostResources {
	var sidecars, peak HostResources
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		r := containerHost(c.Resources)
		if IsSidecar(c) {
			sidecars = sidecars.plus(r)
			peak = peak.max(sidecars)
			continue
		}
		peak = peak.max(sidecars.plus(r))
	}
	running := sidecars
	for i := range pod.Spec.Containers {
		running = running.plus(containerHost(pod.Spec.Containers[i].Resources))
	}
	return peak.max(running).plus(hostOf(pod.Spec.Overhead))
}

// containerHost is one container's request, its limit where the request is unset.
func containerHost(r corev1.ResourceRequirements) HostResources {
	h := hostOf(r.Requests)
	lim := hostOf(r.Limits)
	if _, ok := r.Requests[corev1.ResourceCPU]; !ok {
		h.CPUMilli = lim.CPUMilli
	}
	if _, ok := r.Requests[corev1.ResourceMemory]; !ok {
		h.MemoryMiB = lim.MemoryMiB
	}
	return h
}

// hostOf reads CPU (milli) and memory (MiB, rounded up) from l.
func hostOf(l corev1.ResourceList) HostResources {
	var h HostResources
	if q, ok := l[corev1.ResourceCPU]; ok {
		h.CPUMilli = q.MilliValue()
	}
	if q, ok := l[corev1.ResourceMemory]; ok {
		h.MemoryMiB = (q.Value() + 1<<20 - 1) >> 20
	}
	return h
}

// Minus returns h less o, each resource floored at 0: what is free of h once o is taken.
func (h HostResources) Minus(o HostResources) HostResources {
	return HostResources{CPUMilli: max(h.CPUMilli-o.CPUMilli, 0), MemoryMiB: max(h.MemoryMiB-o.MemoryMiB, 0)}
}

func (h HostResources) plus(o HostResources) HostResources {
	return HostResources{CPUMilli: h.CPUMilli + o.CPUMilli, MemoryMiB: h.MemoryMiB + o.MemoryMiB}
}

func (h HostResources) max(o HostResources) HostResources {
	return HostResources{CPUMilli: max(h.CPUMilli, o.CPUMilli), MemoryMiB: max(h.MemoryMiB, o.MemoryMiB)}
}

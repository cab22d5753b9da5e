package vgpu

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Resource names a user writes in a container's limits (or requests). The
// values are per container; ResourceMemory, ResourceMemoryPercentage and
// ResourceCores apply to each of the container's GPUs. A container that sets
// ResourceGPU alone gets whole GPUs (all memory, all compute, no sharing).
// RequestFromPod is the one place that reads them.
const (
	// ResourceGPU is the number of physical GPUs a container gets a slice
	// of, each slice on a different GPU: an integer from 1 to
	// MaxGPUsPerContainer. The device plugin advertises it to the kubelet.
	ResourceGPU corev1.ResourceName = "hami.io/gpu"
	// ResourceMemory is the GPU memory of each slice. A plain number is MiB
	// ("10240"); a quantity with a binary suffix ("10Gi") is bytes and must
	// be a whole number of MiB. Scheduler-only: no node advertises it.
	ResourceMemory corev1.ResourceName = "hami.io/gpumem"
	// ResourceMemoryPercentage is the GPU memory of each slice as a percent
	// of that GPU's schedulable memory, 1 to 100. It excludes
	// ResourceMemory. Scheduler-only.
	ResourceMemoryPercentage corev1.ResourceName = "hami.io/gpumem-percentage"
	// ResourceCores is the compute of each slice as a percent of that GPU,
	// 1 to 100. Unset means no compute is reserved and the slice is not
	// throttled. Scheduler-only.
	ResourceCores corev1.ResourceName = "hami.io/gpucores"
)

const (
	// MaxGPUsPerContainer bounds ResourceGPU: more GPUs than any node has is
	// a spec error, not a scheduling failure.
	MaxGPUsPerContainer = 16
	// MaxMemoryMiB bounds ResourceMemory (16 TiB per GPU, far beyond any
	// GPU). It exists to catch "10G" written for "10Gi": a plain or
	// decimal-suffixed number is MiB, so "10G" would ask for 10^10 MiB.
	MaxMemoryMiB = 1 << 24
	// MaxPercent is the upper bound of ResourceMemoryPercentage and
	// ResourceCores: 100 is the whole GPU.
	MaxPercent = 100
)

// Resources lists the resource names this package reads, in the order
// RequestFromPod checks them and reports errors.
func Resources() []corev1.ResourceName {
	return []corev1.ResourceName{ResourceGPU, ResourceMemory, ResourceMemoryPercentage, ResourceCores}
}

// IsExtendedResourceName reports whether name can be an extended resource a
// device plugin registers: domain/name, the domain a DNS subdomain outside
// kubernetes.io (and not "requests"), the whole a qualified name. Config
// validation of the device plugin and the extender calls it.
func IsExtendedResourceName(name string) bool {
	domain, rest, ok := strings.Cut(name, "/")
	if !ok || rest == "" || strings.Contains(rest, "/") {
		return false
	}
	if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") || domain == "requests" {
		return false
	}
	return len(validation.IsDNS1123Subdomain(domain)) == 0 && len(validation.IsQualifiedName(name)) == 0
}

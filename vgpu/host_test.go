package vgpu_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuslice/gpuslice/vgpu"
)

func TestHostRequestOf(t *testing.T) {
	t.Parallel()
	req := func(cpu, mem string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}
	}
	always := corev1.ContainerRestartPolicyAlways
	tests := []struct {
		name string
		spec corev1.PodSpec
		want vgpu.HostResources
	}{
		{"containers sum", corev1.PodSpec{Containers: []corev1.Container{{Resources: req("500m", "1Gi")}, {Resources: req("1", "512Mi")}}},
			vgpu.HostResources{CPUMilli: 1500, MemoryMiB: 1536}},
		{"a larger init container wins", corev1.PodSpec{
			InitContainers: []corev1.Container{{Resources: req("4", "100Mi")}},
			Containers:     []corev1.Container{{Resources: req("1", "1Gi")}}},
			vgpu.HostResources{CPUMilli: 4000, MemoryMiB: 1024}},
		{"sidecars run beside later init containers and the app", corev1.PodSpec{
			InitContainers: []corev1.Container{{Resources: req("1", "1Gi"), RestartPolicy: &always}, {Resources: req("2", "1Gi")}},
			Containers:     []corev1.Container{{Resources: req("500m", "256Mi")}}},
			vgpu.HostResources{CPUMilli: 3000, MemoryMiB: 2048}},
		{"limits count where requests are unset, memory rounds up, overhead adds", corev1.PodSpec{
			Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1000Ki")}}}},
			Overhead:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}},
			vgpu.HostResources{CPUMilli: 2100, MemoryMiB: 1}},
		{"nothing asked", corev1.PodSpec{Containers: []corev1.Container{{}}}, vgpu.HostResources{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tc.want, vgpu.HostRequestOf(&corev1.Pod{Spec: tc.spec})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

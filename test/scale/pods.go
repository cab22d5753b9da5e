package scale

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// LabelPhase is the label every harness pod carries: the name of its phase.
const LabelPhase = "gpuslice.io/scale-phase"

// Host resources every harness pod requests, plain or GPU, so that kube-scheduler's own resource
// fit has the same work for both.
const (
	podCPUMilli  = 100
	podMemoryMiB = 128
)

// Slice is one GPU slice size of the GPU phase's mix.
type Slice struct {
	// MemoryMiB and CoresPercent are the slice's hami.io/gpumem and hami.io/gpucores (0: no
	// compute reserved).
	MemoryMiB    int64
	CoresPercent int
	// Weight is the slice's share of the mix, relative to the others.
	Weight int
}

// SliceMix is the GPU phase's six slice sizes, small slices most common. The largest is 24 GiB,
// not 40: the trace's largest GPUs have 32 GiB, so a 40 GiB slice would fit nowhere.
var SliceMix = []Slice{
	{MemoryMiB: 1 << 10, CoresPercent: 5, Weight: 30},
	{MemoryMiB: 2 << 10, CoresPercent: 10, Weight: 25},
	{MemoryMiB: 4 << 10, CoresPercent: 15, Weight: 20},
	{MemoryMiB: 8 << 10, CoresPercent: 25, Weight: 12},
	{MemoryMiB: 16 << 10, CoresPercent: 50, Weight: 8},
	{MemoryMiB: 24 << 10, Weight: 5},
}

// PlainPods returns n pods named prefix-00000 on that ask for CPU and memory only: the stock
// default-scheduler places them.
func PlainPods(prefix string, n int) []*corev1.Pod {
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		pods[i] = pod(fmt.Sprintf("%s-%05d", prefix, i), nil)
	}
	return pods
}

// GPUPods returns n pods named prefix-00000 on, each asking for one slice of one GPU drawn from
// mix with seed (the same seed gives the same pods): the webhook steers them to the gpuslice
// profile.
func GPUPods(prefix string, n int, mix []Slice, seed uint64) []*corev1.Pod {
	total := 0
	for _, s := range mix {
		total += s.Weight
	}
	rng := rand.New(rand.NewPCG(seed, 0)) //nolint:gosec // G404: a reproducible mix, not a secret
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		draw := rng.IntN(total)
		s := mix[len(mix)-1]
		for _, c := range mix {
			if draw < c.Weight {
				s = c
				break
			}
			draw -= c.Weight
		}
		limits := corev1.ResourceList{
			vgpu.ResourceGPU:    *resource.NewQuantity(1, resource.DecimalSI),
			vgpu.ResourceMemory: resource.MustParse(strconv.FormatInt(s.MemoryMiB, 10)),
		}
		if s.CoresPercent > 0 {
			limits[vgpu.ResourceCores] = *resource.NewQuantity(int64(s.CoresPercent), resource.DecimalSI)
		}
		pods[i] = pod(fmt.Sprintf("%s-%05d", prefix, i), limits)
	}
	return pods
}

// pod is one pause container requesting the harness's host resources, plus limits.
func pod(name string, limits corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{
						corev1.ResourceCPU:    *resource.NewMilliQuantity(podCPUMilli, resource.DecimalSI),
						corev1.ResourceMemory: *resource.NewQuantity(podMemoryMiB<<20, resource.BinarySI),
					},
					Limits: limits,
				},
			}},
		},
	}
}

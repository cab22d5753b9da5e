// Package demo is what make demo runs on the local cluster of package cluster: its GPU nodes and
// its sample pods (slices of several sizes that share GPUs, pods pinned to a model, a whole-GPU
// pod), so that the demo command and the tests that drive the same workload share one list.
package demo

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// DRANodeLabel is the label of the demo's DRA-mode node, as the chart's dra.nodeSelector.
var DRANodeLabel = map[string]string{vgpu.LabelNodeMode: vgpu.NodeModeDRA}

// PodLabel is the label every sample pod carries (app=gpuslice-demo).
const PodLabel = "app"

// podLabelValue is PodLabel's value.
const podLabelValue = "gpuslice-demo"

// Nodes returns the demo's simulated GPU nodes; with dra, a third node in DRA mode.
func Nodes(dra bool) []cluster.NodeOptions {
	nodes := []cluster.NodeOptions{
		{Name: "gpu-a100", FakeGPUs: "8xA100-80GB"},
		{Name: "gpu-mixed", FakeGPUs: "4xT4-16GB,2xL4-24GB"},
	}
	if dra {
		nodes = append(nodes, cluster.NodeOptions{Name: "gpu-dra", FakeGPUs: "2xA100-80GB", DRA: true, Labels: DRANodeLabel})
	}
	return nodes
}

// SamplePod is one of the demo's pods: its name, GPU memory (MiB), compute percent, GPU model
// filter, or a number of whole GPUs instead of a slice.
type SamplePod struct {
	Name      string
	MemoryMiB int64
	Cores     int64
	Model     string
	WholeGPUs int64
	// DRA makes the pod select the DRA-mode node: the webhook turns it into a claim.
	DRA bool
}

// SamplePods returns the demo's pods: slices of several sizes that share GPUs, two pinned to a
// model, and one whole-GPU pod beside them; with dra, two more for the DRA node.
func SamplePods(dra bool) []SamplePod {
	if dra {
		return append(SamplePods(false),
			SamplePod{Name: "dra-train-0", MemoryMiB: 40960, Cores: 50, DRA: true},
			SamplePod{Name: "dra-infer-0", MemoryMiB: 10240, Cores: 20, Model: "A100", DRA: true})
	}
	return []SamplePod{
		{Name: "train-0", MemoryMiB: 40960, Cores: 50},
		{Name: "train-1", MemoryMiB: 40960, Cores: 50},
		{Name: "infer-0", MemoryMiB: 10240, Cores: 20},
		{Name: "infer-1", MemoryMiB: 10240, Cores: 20},
		{Name: "infer-2", MemoryMiB: 10240, Cores: 20},
		{Name: "notebook-0", MemoryMiB: 4096, Model: "T4"},
		{Name: "notebook-1", MemoryMiB: 4096, Model: "T4"},
		{Name: "exclusive-0", WholeGPUs: 1, Model: "L4"},
	}
}

// Pod returns sp as a Pod in the default namespace with one container, cuda. The webhook fills
// in hami.io/gpu: 1 for slices and the scheduler name.
func (sp SamplePod) Pod() *corev1.Pod {
	limits := corev1.ResourceList{}
	if sp.WholeGPUs > 0 {
		limits[vgpu.ResourceGPU] = *resource.NewQuantity(sp.WholeGPUs, resource.DecimalSI)
	} else {
		limits[vgpu.ResourceMemory] = *resource.NewQuantity(sp.MemoryMiB, resource.DecimalSI)
	}
	if sp.Cores > 0 {
		limits[vgpu.ResourceCores] = *resource.NewQuantity(sp.Cores, resource.DecimalSI)
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: sp.Name, Namespace: metav1.NamespaceDefault, Labels: map[string]string{PodLabel: podLabelValue}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:      "cuda",
			Image:     "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
			Resources: corev1.ResourceRequirements{Limits: limits},
		}}},
	}
	if sp.Model != "" {
		p.Annotations = map[string]string{vgpu.AnnotationGPUModel: sp.Model}
	}
	if sp.DRA {
		p.Spec.NodeSelector = DRANodeLabel
	}
	return p
}

// RunSamplePods creates the sample pods and waits up to 2 minutes until all are Running.
func RunSamplePods(ctx context.Context, c *cluster.Cluster, samples []SamplePod) error {
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	for _, sp := range samples {
		if _, err := pods.Create(ctx, sp.Pod(), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create pod %s: %w", sp.Name, err)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: PodLabel + "=" + podLabelValue})
		if err != nil {
			return false, nil
		}
		running := 0
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == len(samples), nil
	})
	if err != nil {
		return fmt.Errorf("wait for the sample pods to run: %w", err)
	}
	return nil
}

package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/webhook"
)

// draRequestsMetric is the extender's count of answered /dra/prioritize calls.
const draRequestsMetric = `gpuslice_extender_requests_total{code="200",verb="dra/prioritize"}`

// withRequests gives every container of pod CPU and memory requests.
func withRequests(pod *corev1.Pod, cpu, memory resource.Quantity) *corev1.Pod {
	for i := range pod.Spec.Containers {
		pod.Spec.Containers[i].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: memory}
	}
	return pod
}

// plainPod is a pod without claims or GPU resources.
func plainPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}},
	}
}

// onNode pins pod to node by its hostname label.
func onNode(pod *corev1.Pod, node string) *corev1.Pod {
	if pod.Spec.NodeSelector == nil {
		pod.Spec.NodeSelector = map[string]string{}
	}
	pod.Spec.NodeSelector[corev1.LabelHostname] = node
	return pod
}

// TestDRAScore proves that in DRA mode gpuslice's score chooses the node and kube-scheduler's
// CPU and memory scores alone would choose the other. Two DRA nodes of 2 × A100-80GB: dra-gpu
// holds a 40 GiB claim, dra-cpu none but a pod asking for half its CPU and memory. A pod without
// a claim in the gpuslice profile, whose nodes the extender scores 0 (neutral), goes where
// kube-scheduler's MostAllocated and BalancedAllocation put it: dra-cpu. A native 20 GiB claim in
// that profile, and a hami.io pod of 20 GiB that the webhook turns into a claim and steers there,
// go where gpuslice's score (binpack, the extender's default) puts them: dra-gpu, whose first GPU
// the allocator's first fit gives them, beside the 40 GiB. Real: every Kubernetes component
// (kube-scheduler's DRA allocator and DynamicResources plugin, the resourceclaim controller, the
// kubelets' DRA manager) and gpuslice's binaries. Fake: NVML and the container runtime.
func TestDRAScore(t *testing.T) {
	opts := clusterOptions(
		cluster.NodeOptions{Name: "dra-gpu", FakeGPUs: "2xA100-80GB", DRA: true, Labels: draModeLabel},
		cluster.NodeOptions{Name: "dra-cpu", FakeGPUs: "2xA100-80GB", DRA: true, Labels: draModeLabel},
	)
	opts.ControllerManager, opts.DRAScore = true, true
	opts.WebhookArgs = []string{"--dra"}
	c := startClusterWith(t, opts)
	ctx := context.Background()
	createDeviceClass(t, c)
	held := createClaimTemplate(t, c, 40960, 0)
	slice := createClaimTemplate(t, c, 20480, 20)

	node, err := c.Client().CoreV1().Nodes().Get(ctx, "dra-cpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	halfCPU := *resource.NewMilliQuantity(node.Status.Allocatable.Cpu().MilliValue()/2, resource.DecimalSI)
	halfMemory := *resource.NewQuantity(node.Status.Allocatable.Memory().Value()/2, resource.BinarySI)
	small, smallMemory := resource.MustParse("100m"), resource.MustParse("64Mi")

	// The two nodes' state: a 40 GiB claim on dra-gpu, half of dra-cpu's CPU and memory taken.
	createAll(t, c, []*corev1.Pod{
		onNode(withRequests(claimPod("held", held), small, smallMemory), "dra-gpu"),
		onNode(withRequests(plainPod("cpu"), halfCPU, halfMemory), "dra-cpu"),
	})
	waitRunningOn(t, c, "held", "dra-gpu")
	waitRunningOn(t, c, "cpu", "dra-cpu")

	// kube-scheduler's own scores: a pod without a claim in the gpuslice profile.
	plain := withRequests(plainPod("plain"), small, smallMemory)
	plain.Spec.SchedulerName = cluster.SchedulerName
	createAll(t, c, []*corev1.Pod{plain})
	if p := waitRunningOn(t, c, "plain", ""); p.Spec.NodeName != "dra-cpu" {
		t.Fatalf("pod without a claim on %s; want dra-cpu, where MostAllocated CPU and memory put it (else this test proves nothing)", p.Spec.NodeName)
	}

	// gpuslice's score: a native claim in the profile, and a hami.io pod the webhook converts.
	native := withRequests(claimPod("native", slice), small, smallMemory)
	native.Spec.SchedulerName = cluster.SchedulerName
	legacy := legacyPod("legacy", 20480, 20, true)
	legacy.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: small, corev1.ResourceMemory: smallMemory}
	began := time.Now()
	createAll(t, c, []*corev1.Pod{native, legacy})
	var placed []corev1.Pod
	for _, name := range []string{"native", "legacy"} {
		p := waitRunningOn(t, c, name, "")
		if p.Spec.NodeName != "dra-gpu" {
			t.Errorf("pod %s on %s; want dra-gpu, the node gpuslice's score prefers", name, p.Spec.NodeName)
		}
		if p.Spec.SchedulerName != webhook.DefaultSchedulerName {
			t.Errorf("pod %s scheduled by %q; want %s", name, p.Spec.SchedulerName, webhook.DefaultSchedulerName)
		}
		placed = append(placed, *p)
	}
	if !t.Failed() {
		t.Logf("FIGURE dra score: 2 claims placed by gpuslice's score on the packed node in %v, the pod without a claim on the other", time.Since(began).Round(time.Millisecond))
	}
	mism, over := checkDRA(t, c, placed)
	if len(mism)+len(over) > 0 {
		t.Errorf("mismatches %v, over-commits %v", mism, over)
	}
	// The allocator's first fit: both slices on dra-gpu's first GPU, beside the 40 GiB.
	for _, p := range placed {
		for _, st := range p.Status.ResourceClaimStatuses {
			claim, err := c.Client().ResourceV1().ResourceClaims(p.Namespace).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range claim.Status.Allocation.Devices.Results {
				if r.Pool != "dra-gpu" || r.Device != "gpu-0" {
					t.Errorf("pod %s's claim %s on %s/%s; want dra-gpu/gpu-0, the first device with room", p.Name, claim.Name, r.Pool, r.Device)
				}
			}
		}
	}
	gauges, err := scrapeGauges(c.ExtenderURL()+"/metrics", []string{draRequestsMetric})
	if err != nil {
		t.Fatal(err)
	}
	if gauges[draRequestsMetric] == 0 {
		t.Errorf("the extender answered no /dra/prioritize call (%v)", gauges)
	}
}

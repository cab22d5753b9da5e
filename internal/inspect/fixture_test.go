package inspect

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// now is the fixed clock of every fixture.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const systemNS = "gpuslice-system"

// chartLabels are the labels the chart puts on an object of component.
func chartLabels(component string) map[string]string {
	return map[string]string{LabelPartOf: PartOf, "app.kubernetes.io/name": "gpuslice", LabelComponent: component}
}

// placedPod returns a Running pod on node holding one slice of memMiB and cores on GPU uuid.
func placedPodObj(name, node, uuid string, memMiB int64, cores int) corev1.Pod {
	p := vgputest.Pod(name).Container("main").GPU(1).MemoryMiB(memMiB).Cores(cores).NodeName(node).Obj()
	a, err := vgpu.EncodePodAllocation(vgputest.Allocation(node).Container("main").Slice(uuid, memMiB, cores).Obj())
	if err != nil {
		panic(err)
	}
	p.Annotations = map[string]string{vgpu.AnnotationPodAllocation: a}
	p.Status.Phase = corev1.PodRunning
	return *p
}

// pluginPod returns the chart's device-plugin pod on node, Ready with restarts.
func pluginPodObj(node string, ready bool, restarts int32) corev1.Pod {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpuslice-device-plugin-" + node, Namespace: systemNS, Labels: chartLabels(ComponentDevicePlugin)},
		Spec: corev1.PodSpec{NodeName: node, Volumes: []corev1.Volume{{Name: devicePluginVolume, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet/device-plugins"}}}}},
		Status: corev1.PodStatus{
			Phase:             corev1.PodRunning,
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: status}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "device-plugin", RestartCount: restarts}},
		},
	}
	if restarts > 0 {
		p.Status.ContainerStatuses[0].LastTerminationState.Terminated = &corev1.ContainerStateTerminated{
			Reason: "OOMKilled", ExitCode: 137, FinishedAt: metav1.NewTime(now.Add(-time.Minute)),
		}
	}
	return p
}

// fixture is a cluster of four nodes: gpu-a healthy with two pods sharing a GPU, gpu-b whose
// plugin stopped (capacity kept, allocatable 0, label false, heartbeat stale), gpu-c whose plugin
// runs but never registered (wrong device-plugin folder), and cpu-1 without GPUs; the chart's
// webhook, Service and scheduler; and one pending pod too big for any GPU.
func fixture() *Snapshot {
	invA := vgputest.Node("gpu-a").GPU("GPU-a0", 81920).GPU("GPU-a1", 81920).SplitCount(4).
		Model("GPU-a0", "NVIDIA A100-SXM4-80GB").Model("GPU-a1", "NVIDIA A100-SXM4-80GB").Obj()
	invB := vgputest.Node("gpu-b").GPU("GPU-b0", 15360).Model("GPU-b0", "Tesla T4").SplitCount(4).Obj()
	nodeB := vgputest.PublishedNode(invB).Ready(false).Obj()
	nodeB.Status.Allocatable[vgpu.ResourceGPU] = resource.MustParse("0")
	nodeC := vgputest.NodeObject("gpu-c").Obj()
	nodeC.Labels = map[string]string{vgpu.LabelGPUReady: "false"}
	nodeA := vgputest.PublishedNode(invA).Obj()
	nodeA.Status.Conditions = []corev1.NodeCondition{{Type: vgpu.ConditionRegistered, Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered, Message: "registered hami.io/gpu: 8 devices"}}
	notRegistered := vgputest.HeartbeatLease("gpu-c", now.Add(-3*time.Second)).
		Heartbeat(vgpu.PluginHeartbeat{Node: "gpu-c", PluginVersion: "test", ResourceName: string(vgpu.ResourceGPU)}).Obj()

	pending := vgputest.Pod("big").Container("main").GPU(1).MemoryMiB(100000).Obj()
	pending.Spec.SchedulerName = defaultSchedulerName
	pending.Status.Phase = corev1.PodPending
	pending.CreationTimestamp = metav1.NewTime(now.Add(-3 * time.Minute))
	pending.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/4 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 3 plugin not ready: label hami.io/gpu.ready is \"false\". preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."}}

	fail := admissionregistrationv1.Fail
	ready := true
	seconds := int32(15)
	holder := "scheduler-0_1234"
	dryRunPod := pending.DeepCopy()
	dryRunPod.Name, dryRunPod.Spec.SchedulerName = dryRunPodName, defaultSchedulerName
	return &Snapshot{
		Now:                now,
		HeartbeatNamespace: vgpu.DefaultHeartbeatNamespace,
		Nodes:              []corev1.Node{*vgputest.NodeObject("cpu-1").Obj(), *nodeA, *nodeB, *nodeC},
		Leases: map[string]coordinationv1.Lease{
			"gpu-a": *vgputest.HeartbeatLease("gpu-a", now.Add(-4*time.Second)).Obj(),
			"gpu-b": *vgputest.HeartbeatLease("gpu-b", now.Add(-5*time.Minute)).Obj(),
			"gpu-c": *notRegistered,
		},
		Pods: []corev1.Pod{
			*pending,
			placedPodObj("infer", "gpu-a", "GPU-a0", 10240, 20),
			placedPodObj("train", "gpu-a", "GPU-a0", 40960, 50),
			pluginPodObj("gpu-a", true, 0),
			pluginPodObj("gpu-b", false, 3),
			pluginPodObj("gpu-c", true, 0),
		},
		DaemonSets: []appsv1.DaemonSet{{ObjectMeta: metav1.ObjectMeta{Name: "gpuslice-device-plugin", Namespace: systemNS, Labels: chartLabels(ComponentDevicePlugin)}}},
		Deployments: []appsv1.Deployment{{
			ObjectMeta: metav1.ObjectMeta{Name: "gpuslice-scheduler", Namespace: systemNS, Labels: chartLabels(ComponentScheduler)},
			Spec:       appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-scheduler"}, {Name: extenderContainer}}}}},
		}},
		ConfigMaps: []corev1.ConfigMap{{
			ObjectMeta: metav1.ObjectMeta{Name: "gpuslice-scheduler", Namespace: systemNS, Labels: chartLabels(ComponentScheduler)},
			Data: map[string]string{
				schedulerConfigKey: "leaderElection:\n  leaderElect: true\n  resourceNamespace: gpuslice-system\n  resourceName: gpuslice-scheduler\nprofiles:\n- schedulerName: gpuslice-scheduler\nextenders:\n- urlPrefix: http://127.0.0.1:8888\n  filterVerb: filter\n  bindVerb: bind\n",
				extenderConfigKey:  "nodePolicy: binpack\ngpuPolicy: spread\nheartbeatMaxAge: 60s\n",
			},
		}},
		Webhooks: []admissionregistrationv1.MutatingWebhookConfiguration{{
			ObjectMeta: metav1.ObjectMeta{Name: "gpuslice-webhook", Labels: chartLabels(ComponentWebhook)},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "pods.gpuslice.io", FailurePolicy: &fail, ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: systemNS, Name: "gpuslice-webhook"}}}},
		}},
		Services: []corev1.Service{{ObjectMeta: metav1.ObjectMeta{Name: "gpuslice-webhook", Namespace: systemNS}}},
		EndpointSlices: []discoveryv1.EndpointSlice{{
			ObjectMeta: metav1.ObjectMeta{Name: "gpuslice-webhook-x", Namespace: systemNS},
			Endpoints:  []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		}},
		SchedulerLeases: map[string]coordinationv1.Lease{"gpuslice-system/gpuslice-scheduler": {Spec: coordinationv1.LeaseSpec{
			HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &metav1.MicroTime{Time: now.Add(-2 * time.Second)}}}},
		DryRun: &DryRun{Namespace: metav1.NamespaceDefault, Pod: dryRunPod},
	}
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got); go test -update rewrites it:\n%s", path, diff)
	}
}

// jsonOf is v as indented JSON, for golden files.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

package inspect

import (
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// nodeOf returns the Node named name of s.
func nodeOf(s *Snapshot, name string) *corev1.Node {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}
	panic("no node " + name)
}

// TestDoctorBreaks breaks the healthy node gpu-a (or the cluster) of the fixture one way at a time
// and checks the one line that must turn, with its fix.
func TestDoctorBreaks(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		brk          func(s *Snapshot)
		node, check  string
		result       Result
		message, fix string
	}{
		"healthy heartbeat": {func(*Snapshot) {}, "gpu-a", "heartbeat", Pass, "renewed 4s ago", ""},
		"no plugin pod": {func(s *Snapshot) {
			s.Pods = s.Pods[:3]
			delete(s.Leases, "gpu-a")
			nodeOf(s, "gpu-a").Labels["role"] = "gpu"
			s.DaemonSets[0].Spec.Template.Spec.NodeSelector = map[string]string{"nvidia.com/gpu.present": "true"}
		}, "gpu-a", "plugin-pod", Fail, "no gpuslice device-plugin pod", "needs label nvidia.com/gpu.present=true"},
		"no chart": {func(s *Snapshot) {
			s.Pods, s.DaemonSets = s.Pods[:3], nil
			delete(s.Leases, "gpu-a")
		}, "gpu-a", "plugin-pod", Fail, "no gpuslice device-plugin pod", "install the chart"},
		"plugin outside a pod": {func(s *Snapshot) { s.Pods, s.DaemonSets = s.Pods[:3], nil }, "gpu-a", "plugin-pod", Warn, "runs outside a pod of the chart", "install the chart"},
		"plugin restarted":     {func(s *Snapshot) { s.Pods[3] = pluginPodObj("gpu-a", true, 2) }, "gpu-a", "plugin-ready", Warn, "2 restarts; last exit OOMKilled (code 137)", "raise devicePlugin.resources.limits.memory"},
		"condition false": {func(s *Snapshot) {
			nodeOf(s, "gpu-a").Status.Conditions = []corev1.NodeCondition{{Type: vgpu.ConditionRegistered, Status: corev1.ConditionFalse, Reason: vgpu.ReasonRegisterFailed, Message: "kubelet: resource already registered"}}
		}, "gpu-a", "condition", Fail, "GPUSliceRegistered=False (RegisterFailed): kubelet: resource already registered", "kubelet's log"},
		"driver not found": {func(s *Snapshot) {
			nodeOf(s, "gpu-a").Status.Conditions = []corev1.NodeCondition{{Type: vgpu.ConditionRegistered, Status: corev1.ConditionFalse, Reason: vgpu.ReasonDriverNotFound}}
		}, "gpu-a", "condition", Fail, "DriverNotFound", "install the NVIDIA driver"},
		"heartbeat stale, said by the extender": {func(s *Snapshot) {
			nodeOf(s, "gpu-a").Status.Conditions = []corev1.NodeCondition{{Type: vgpu.ConditionRegistered, Status: corev1.ConditionUnknown, Reason: vgpu.ReasonHeartbeatStale, Message: "heartbeat not renewed for 1m0s"}}
		}, "gpu-a", "condition", Fail, "GPUSliceRegistered=Unknown (HeartbeatStale): heartbeat not renewed for 1m0s", "stopped renewing its heartbeat Lease"},
		"socket missing named by the condition": {func(s *Snapshot) {
			nodeOf(s, "gpu-c").Status.Conditions = []corev1.NodeCondition{{Type: vgpu.ConditionRegistered, Status: corev1.ConditionFalse, Reason: vgpu.ReasonKubeletSocketMissing, Message: "no /var/lib/kubelet/device-plugins/kubelet.sock"}}
		}, "gpu-c", "kubelet-socket", Fail, "KubeletSocketMissing: no /var/lib/kubelet/device-plugins/kubelet.sock", "devicePlugin.kubeletRootDir"},
		"grace period": {func(s *Snapshot) {
			nodeOf(s, "gpu-a").Status.Allocatable[vgpu.ResourceGPU] = resource.MustParse("0")
		}, "gpu-a", "allocatable", Fail, "capacity 8 but allocatable 0: the kubelet lost the device plugin's endpoint (it keeps the capacity for 5m0s after the plugin stops, then drops it); the plugin's heartbeat was last renewed 4s ago", "restart the plugin (kubectl -n gpuslice-system delete pod gpuslice-device-plugin-gpu-a)"},
		"unhealthy devices": {func(s *Snapshot) {
			nodeOf(s, "gpu-a").Status.Allocatable[vgpu.ResourceGPU] = resource.MustParse("4")
		}, "gpu-a", "allocatable", Warn, "allocatable 4 of capacity 8: 4 devices unhealthy", "XID"},
		"inventory disagrees": {func(s *Snapshot) {
			nodeOf(s, "gpu-a").Status.Allocatable[vgpu.ResourceGPU] = resource.MustParse("4")
		}, "gpu-a", "inventory", Warn, "= 8 devices, but allocatable hami.io/gpu is 4", "restart the plugin"},
		"malformed inventory": {func(s *Snapshot) {
			nodeOf(s, "gpu-a").Annotations[vgpu.AnnotationNodeInventory] = `{"version":2}`
		}, "gpu-a", "inventory", Fail, "unknown version", "another version"},
		"inventory of another node": {func(s *Snapshot) {
			n := nodeOf(s, "gpu-a")
			n.Annotations[vgpu.AnnotationNodeInventory] = nodeOf(s, "gpu-b").Annotations[vgpu.AnnotationNodeInventory]
		}, "gpu-a", "inventory", Fail, `names node "gpu-b", not "gpu-a"`, ""},
		"label removed":             {func(s *Snapshot) { delete(nodeOf(s, "gpu-a").Labels, vgpu.LabelGPUReady) }, "gpu-a", "ready-label", Fail, "is missing", "rewrites it on start"},
		"label garbled":             {func(s *Snapshot) { nodeOf(s, "gpu-a").Labels[vgpu.LabelGPUReady] = "yes" }, "gpu-a", "ready-label", Fail, `"yes": must be "true" or "false"`, ""},
		"no lease":                  {func(s *Snapshot) { delete(s.Leases, "gpu-a") }, "gpu-a", "heartbeat", Fail, "no heartbeat Lease kube-node-lease/gpuslice-gpu-a", "RBAC"},
		"stale lease":               {func(s *Snapshot) { s.Now = s.Now.Add(time.Minute) }, "gpu-a", "heartbeat", Fail, "renewed 1m4s ago, longer than its 40s duration", "restart the plugin"},
		"no webhook":                {func(s *Snapshot) { s.Webhooks = nil }, "", "webhook", Fail, "no gpuslice MutatingWebhookConfiguration", "helm upgrade --install"},
		"webhook without endpoints": {func(s *Snapshot) { s.EndpointSlices = nil }, "", "webhook-endpoints", Fail, "has no ready endpoint", "kubectl -n gpuslice-system get pods -l app.kubernetes.io/component=webhook"},
		"webhook Service gone":      {func(s *Snapshot) { s.Services = nil }, "", "webhook-endpoints", Fail, "does not exist", ""},
		"webhook refuses":           {func(s *Snapshot) { s.DryRun = &DryRun{Namespace: "default", Err: "failed calling webhook"} }, "", "webhook-admission", Fail, "refused a dry-run GPU pod", "logs deployment/gpuslice-webhook"},
		"dry run forbidden": {func(s *Snapshot) {
			s.DryRun = &DryRun{Namespace: "default", Err: `pods is forbidden: User "viewer" cannot create resource "pods"`, Forbidden: true}
		}, "", "webhook-admission", Warn, "cannot try a dry-run GPU pod in namespace default", "may create pods there"},
		"webhook ignored": {func(s *Snapshot) {
			s.DryRun.Pod.Spec.SchedulerName = corev1.DefaultSchedulerName
			ignore := admissionregistrationv1.Ignore
			s.Webhooks[0].Webhooks[0].FailurePolicy = &ignore
		}, "", "webhook-admission", Fail, `schedulerName "default-scheduler", not gpuslice-scheduler`, "failurePolicy Ignore"},
		"no scheduler": {func(s *Snapshot) { s.ConfigMaps = nil }, "", "scheduler-profile", Warn, "no gpuslice scheduler ConfigMap", "scheduler.enabled=true"},
		"profile without bind": {func(s *Snapshot) {
			s.ConfigMaps[0].Data[schedulerConfigKey] = "profiles:\n- schedulerName: gpuslice-scheduler\nextenders:\n- urlPrefix: http://x\n  filterVerb: filter\n"
		}, "", "scheduler-profile", Fail, "no extender with filterVerb and bindVerb", ""},
		"scheduler stopped": {func(s *Snapshot) { s.Now = s.Now.Add(time.Minute) }, "", "scheduler-leader", Fail, "the gpuslice kube-scheduler is not running", "-c kube-scheduler"},
		"extender down": {func(s *Snapshot) {
			s.Pods[0].Status.Conditions[0].Reason = corev1.PodReasonSchedulerError
			s.Pods[0].Status.Conditions[0].Message = `Post "http://127.0.0.1:8888/filter": connection refused`
		}, "", "extender", Fail, "cannot use the gpuslice extender (pod default/big)", "kubectl -n gpuslice-system logs deployment/gpuslice-scheduler -c extender"},
		"no extender container":    {func(s *Snapshot) { s.Deployments = nil }, "", "extender", Fail, "no gpuslice Deployment has an extender container", "helm upgrade --install"},
		"pod bypassed the webhook": {func(s *Snapshot) { s.Pods[0].Spec.SchedulerName = corev1.DefaultSchedulerName }, "", "pending-pod", Fail, `schedulerName "default-scheduler"`, "recreate the pod"},
		"pod never tried":          {func(s *Snapshot) { s.Pods[0].Status.Conditions = nil }, "", "pending-pod", Fail, "no scheduler tried it", "scheduler-leader"},
		"pod just created": {func(s *Snapshot) {
			s.Pods[0].Status.Conditions = nil
			s.Pods[0].CreationTimestamp = metav1.NewTime(s.Now.Add(-time.Second))
		}, "", "pending-pod", Pass, "waiting for its first scheduling attempt", ""},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := fixture()
			tt.brk(s)
			r, err := Doctor(s, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got *Check
			for i := range r.Checks {
				if c := &r.Checks[i]; c.Node == tt.node && c.Name == tt.check {
					got = c
				}
			}
			switch {
			case got == nil:
				t.Fatalf("no check %s of %q in %+v", tt.check, tt.node, r.Checks)
			case got.Result != tt.result || !strings.Contains(got.Message, tt.message) || !strings.Contains(got.Fix, tt.fix):
				t.Errorf("%s %s = %s %q (fix %q), want %s with %q (fix with %q)", tt.node, tt.check, got.Result, got.Message, got.Fix, tt.result, tt.message, tt.fix)
			}
		})
	}
}

func TestDoctorNodes(t *testing.T) {
	t.Parallel()
	r, err := Doctor(fixture(), []string{"gpu-a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r.Checks {
		if c.Node != "" && c.Node != "gpu-a" {
			t.Errorf("doctor gpu-a checked %s: %+v", c.Node, c)
		}
	}
	if r.Failures != 0 {
		t.Errorf("doctor gpu-a: %d failures, want 0: %+v", r.Failures, r.Checks)
	}
	if _, err := Doctor(fixture(), []string{"gpu-z"}); err == nil || !strings.Contains(err.Error(), `node "gpu-z": not found`) {
		t.Errorf("Doctor(gpu-z) error = %v, want not found", err)
	}
	empty := &Snapshot{Now: now}
	r, _ = Doctor(empty, nil)
	if r.Checks[0].Name != "gpu-nodes" || r.Checks[0].Result != Fail {
		t.Errorf("empty cluster: first check %+v, want gpu-nodes FAIL", r.Checks[0])
	}
}

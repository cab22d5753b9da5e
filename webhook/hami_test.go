package webhook_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
	"github.com/gpuslice/gpuslice/webhook"
)

func hamiConfig() webhook.Config {
	cfg := webhook.DefaultConfig()
	cfg.HAMiCompat = true
	return cfg
}

// applyWithAPIServerPatcher applies a Result's patch to pod with the JSON
// patch library the API server's mutating admission uses.
func applyWithAPIServerPatcher(t *testing.T, pod *corev1.Pod, ops []webhook.JSONPatchOp) *corev1.Pod {
	t.Helper()
	doc, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		t.Fatalf("decode patch %s: %v", raw, err)
	}
	out, err := patch.Apply(doc)
	if err != nil {
		t.Fatalf("apply patch %s: %v", raw, err)
	}
	var patched corev1.Pod
	if err := json.Unmarshal(out, &patched); err != nil {
		t.Fatal(err)
	}
	return &patched
}

// hamiPod is a pod written for HAMi: its default resource names and
// annotations.
func hamiPod() *corev1.Pod {
	return admitted(vgputest.Pod("p").
		Annotation("nvidia.com/use-gputype", "A100,H100").
		Annotation("nvidia.com/nouse-gputype", "MIG").
		Annotation("nvidia.com/use-gpuuuid", "GPU-a,GPU-b").
		Annotation("nvidia.com/nouse-gpuuuid", "GPU-c").
		Annotation("nvidia.com/numa-bind", "true").
		Annotation("hami.io/gpu-scheduler-policy", "spread").
		Annotation("hami.io/node-scheduler-policy", "binpack").
		Annotation("example.com/other", "kept").
		Container("train").Limit("nvidia.com/gpu", "2").Limit("nvidia.com/gpumem", "3000").Limit("nvidia.com/gpucores", "30").
		Container("eval").Limit("nvidia.com/gpu", "1").Limit("nvidia.com/gpumem-percentage", "50").
		Container("web").Limit(corev1.ResourceCPU, "1").Obj(), corev1.DefaultSchedulerName)
}

func TestMutateHAMiCompat(t *testing.T) {
	t.Parallel()
	pod := hamiPod()
	got, err := webhook.Mutate(pod, hamiConfig())
	if err != nil || !got.Allowed {
		t.Fatalf("Mutate = %+v, %v; want allowed", got, err)
	}
	patched := applyWithAPIServerPatcher(t, pod, got.Patch)

	wantAnnotations := map[string]string{
		vgpu.AnnotationGPUModel:        "A100,H100",
		vgpu.AnnotationGPUModelExclude: "MIG",
		vgpu.AnnotationGPUUUID:         "GPU-a,GPU-b",
		vgpu.AnnotationGPUUUIDExclude:  "GPU-c",
		vgpu.AnnotationNUMABind:        "true",
		vgpu.AnnotationGPUPolicy:       "spread",
		vgpu.AnnotationNodePolicy:      "binpack",
		"example.com/other":            "kept",
	}
	if diff := cmp.Diff(wantAnnotations, patched.Annotations); diff != "" {
		t.Errorf("annotations after the patch (-want +got):\n%s", diff)
	}
	want := map[string]corev1.ResourceList{
		"train": {vgpu.ResourceGPU: resource.MustParse("2"), vgpu.ResourceMemory: resource.MustParse("3000"), vgpu.ResourceCores: resource.MustParse("30")},
		"eval":  {vgpu.ResourceGPU: resource.MustParse("1"), vgpu.ResourceMemoryPercentage: resource.MustParse("50")},
		"web":   {corev1.ResourceCPU: resource.MustParse("1")},
	}
	for _, c := range patched.Spec.Containers {
		for name, list := range map[string]corev1.ResourceList{"limits": c.Resources.Limits, "requests": c.Resources.Requests} {
			if !equalResources(want[c.Name], list) {
				t.Errorf("container %s %s = %v, want %v", c.Name, name, list, want[c.Name])
			}
		}
	}
	if patched.Spec.SchedulerName != webhook.DefaultSchedulerName {
		t.Errorf("schedulerName = %q, want %q", patched.Spec.SchedulerName, webhook.DefaultSchedulerName)
	}
	c, err := vgpu.ConstraintsFromPod(patched)
	if err != nil {
		t.Fatal(err)
	}
	wantConstraints := vgpu.Constraints{
		Models: []string{"A100", "H100"}, ExcludeModels: []string{"MIG"}, UUIDs: []string{"GPU-a", "GPU-b"}, ExcludeUUIDs: []string{"GPU-c"},
		NUMABind: true, NodePolicy: vgpu.PolicyBinpack, GPUPolicy: vgpu.PolicySpread,
	}
	if diff := cmp.Diff(wantConstraints, c); diff != "" {
		t.Errorf("constraints of the rewritten pod (-want +got):\n%s", diff)
	}
	req, err := vgpu.RequestFromPod(patched)
	if err != nil || len(req.Containers) != 2 {
		t.Errorf("RequestFromPod of the rewritten pod = %+v, %v; want two GPU containers", req, err)
	}

	// Idempotent: the rewritten pod needs nothing more.
	again, err := webhook.Mutate(patched, hamiConfig())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(webhook.Result{Allowed: true}, again); diff != "" {
		t.Errorf("Mutate of the patched pod (-want +got):\n%s", diff)
	}
	// Off by default: the HAMi pod is not a gpuslice pod.
	if off, err := webhook.Mutate(pod, webhook.DefaultConfig()); err != nil || !off.Skipped {
		t.Errorf("Mutate without hamiCompat = %+v, %v; want skipped", off, err)
	}
}

func equalResources(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, q := range a {
		if p, ok := b[k]; !ok || p.Cmp(q) != 0 {
			return false
		}
	}
	return true
}

func TestMutateHAMiCompatCases(t *testing.T) {
	t.Parallel()
	const std = corev1.DefaultSchedulerName
	tests := []struct {
		name        string
		pod         *corev1.Pod
		wantPatch   []webhook.JSONPatchOp // nil: not checked
		wantDenied  []string              // parts of the denial
		wantSkipped bool
	}{{
		name: "init containers and requests are renamed in spec order",
		pod: vgputest.Pod("p").Sidecar("proxy").Request("nvidia.com/gpumem", "1024").Limit("nvidia.com/gpumem", "1024").
			Container("main").Limit("nvidia.com/gpu", "1").Obj(),
		wantPatch: []webhook.JSONPatchOp{
			{Op: "move", From: "/spec/initContainers/0/resources/limits/nvidia.com~1gpumem", Path: "/spec/initContainers/0/resources/limits/hami.io~1gpumem"},
			{Op: "move", From: "/spec/initContainers/0/resources/requests/nvidia.com~1gpumem", Path: "/spec/initContainers/0/resources/requests/hami.io~1gpumem"},
			{Op: "move", From: "/spec/containers/0/resources/limits/nvidia.com~1gpu", Path: "/spec/containers/0/resources/limits/hami.io~1gpu"},
			{Op: "add", Path: "/spec/schedulerName", Value: webhook.DefaultSchedulerName},
			{Op: "add", Path: "/spec/initContainers/0/resources/limits/hami.io~1gpu", Value: "1"},
			{Op: "add", Path: "/spec/initContainers/0/resources/requests/hami.io~1gpu", Value: "1"},
		},
	}, {
		name: "a HAMi name beside its gpuslice name with the same value is dropped",
		pod: admitted(vgputest.Pod("p").Annotation("nvidia.com/use-gputype", "A100").Annotation(vgpu.AnnotationGPUModel, "A100").
			Limit("nvidia.com/gpu", "1").Limit(vgpu.ResourceGPU, "1").Obj(), webhook.DefaultSchedulerName),
		wantPatch: []webhook.JSONPatchOp{
			{Op: "remove", Path: "/metadata/annotations/nvidia.com~1use-gputype"},
			{Op: "remove", Path: "/spec/containers/0/resources/limits/nvidia.com~1gpu"},
			{Op: "remove", Path: "/spec/containers/0/resources/requests/nvidia.com~1gpu"},
		},
	}, {
		name: "conflicting values are denied, naming both",
		pod: admitted(vgputest.Pod("p").Annotation("nvidia.com/use-gputype", "A100").Annotation(vgpu.AnnotationGPUModel, "H100").
			Limit("nvidia.com/gpumem", "1000").Limit(vgpu.ResourceMemory, "2000").Obj(), std),
		wantDenied: []string{
			`annotation nvidia.com/use-gputype="A100": conflicts with hami.io/gpu-model="H100"`,
			`container "main": limits nvidia.com/gpumem=1000: conflicts with hami.io/gpumem=2000`,
		},
	}, {
		name:       "a HAMi policy gpuslice lacks is denied",
		pod:        admitted(vgputest.Pod("p").Annotation("hami.io/gpu-scheduler-policy", "topology-aware").Limit("nvidia.com/gpu", "1").Obj(), std),
		wantDenied: []string{`annotation hami.io/gpu-scheduler-policy="topology-aware": must be binpack or spread`},
	}, {
		name:        "a pod without GPU resources and a bad HAMi policy is left alone",
		pod:         admitted(vgputest.Pod("p").Annotation("hami.io/gpu-scheduler-policy", "topology-aware").Limit(corev1.ResourceCPU, "1").Obj(), std),
		wantSkipped: true,
	}, {
		name:        "other nvidia.com resources stay",
		pod:         admitted(vgputest.Pod("p").Limit("nvidia.com/mig-1g.10gb", "1").Obj(), std),
		wantSkipped: true,
	}, {
		name:       "HAMi names pass the usual checks after the rewrite",
		pod:        admitted(vgputest.Pod("p").Limit("nvidia.com/gpucores", "150").Obj(), std),
		wantDenied: []string{"hami.io/gpucores"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := webhook.Mutate(tt.pod, hamiConfig())
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tt.wantSkipped:
				if !got.Skipped || !got.Allowed {
					t.Errorf("Mutate = %+v, want skipped", got)
				}
			case tt.wantDenied != nil:
				if got.Allowed {
					t.Fatalf("Mutate = %+v, want denied", got)
				}
				for _, w := range tt.wantDenied {
					if !strings.Contains(got.Message, w) {
						t.Errorf("denial %q does not contain %q", got.Message, w)
					}
				}
			default:
				if !got.Allowed {
					t.Fatalf("Mutate = %+v, want allowed", got)
				}
				if diff := cmp.Diff(tt.wantPatch, got.Patch); diff != "" {
					t.Errorf("patch (-want +got):\n%s", diff)
				}
				patched := applyWithAPIServerPatcher(t, tt.pod, got.Patch)
				again, err := webhook.Mutate(patched, hamiConfig())
				if err != nil || !again.Allowed || again.Patch != nil {
					t.Errorf("Mutate of the patched pod = %+v, %v; want allowed with no patch", again, err)
				}
			}
		})
	}
}

func TestHAMiCompatMatchExpression(t *testing.T) {
	t.Parallel()
	// The compat expression is the default one with an nvidia.com/ test
	// beside every hami.io/ test.
	got := strings.NewReplacer(" || k.startsWith('nvidia.com/')", "", " || r.startsWith('nvidia.com/')", "").Replace(webhook.HAMiCompatMatchExpression)
	if got != webhook.MatchExpression || strings.Count(webhook.HAMiCompatMatchExpression, "nvidia.com/") != strings.Count(webhook.MatchExpression, "hami.io/") {
		t.Errorf("HAMiCompatMatchExpression is not MatchExpression with nvidia.com/ beside hami.io/:\n%s", webhook.HAMiCompatMatchExpression)
	}
	for _, r := range append(webhook.HAMiResources(), webhook.HAMiAnnotations()...) {
		if !strings.HasPrefix(r.HAMi, "nvidia.com/") && !strings.HasPrefix(r.HAMi, "hami.io/") {
			t.Errorf("%s: neither prefix of the match expression", r.HAMi)
		}
	}
}

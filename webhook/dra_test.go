package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
	"github.com/gpuslice/gpuslice/webhook"
)

// draConfig converts the GPU pods of namespace "ml" and those selecting the DRA pool.
func draConfig() webhook.Config {
	cfg := webhook.DefaultConfig()
	cfg.DRA = webhook.DRAConfig{Enabled: true, Namespaces: []string{"ml"}}
	return cfg
}

// gpuRequest is the device request the webhook makes for one container.
func gpuRequest(name string, count int64, capacity map[resourcev1.QualifiedName]string, selectors ...string) resourcev1.DeviceRequest {
	exact := &resourcev1.ExactDeviceRequest{DeviceClassName: "gpuslice.hami.io", AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count}
	if len(capacity) > 0 {
		exact.Capacity = &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{}}
		for k, v := range capacity {
			exact.Capacity.Requests[k] = resource.MustParse(v)
		}
	}
	exact.Selectors = []resourcev1.DeviceSelector{}
	for _, s := range selectors {
		exact.Selectors = append(exact.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: s}})
	}
	return resourcev1.DeviceRequest{Name: name, Exactly: exact}
}

// TestMutateDRA checks the conversion of hami.io pods bound for a DRA pool: which pods are
// converted, the template (requests, capacity, selectors) and the pod after the API server
// applied the patch; and the denials, each naming the field.
func TestMutateDRA(t *testing.T) {
	const std = corev1.DefaultSchedulerName
	tests := []struct {
		name string
		pod  *corev1.Pod
		cfg  *webhook.Config
		// want is nil when the pod must not be converted.
		want *resourcev1.ResourceClaimSpec
		deny string
	}{{
		name: "legacy pod in a DRA namespace: 10 GiB, 30% on an A100",
		pod: admitted(vgputest.Pod("p").Namespace("ml").Annotation(vgpu.AnnotationGPUModel, "A100").
			Container("main").GPU(1).MemoryMiB(10240).Cores(30).Obj(), std),
		want: &resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
			gpuRequest("main", 1, map[resourcev1.QualifiedName]string{"memory": "10Gi", "cores": "30"},
				`device.attributes["gpuslice.hami.io"].model.lowerAscii().contains("a100")`),
		}}},
	}, {
		name: "pod selecting the DRA pool in another namespace; memory with a unit; UUIDs and NUMA",
		pod: admitted(vgputest.Pod("p").NodeSelector(vgpu.LabelNodeMode, vgpu.NodeModeDRA).
			Annotation(vgpu.AnnotationGPUUUIDExclude, "GPU-bad").Annotation(vgpu.AnnotationGPUModelExclude, "T4,V100").Annotation(vgpu.AnnotationNUMABind, "true").
			Container("train").GPU(2).Limit(vgpu.ResourceMemory, "20Gi").Obj(), std),
		want: &resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{gpuRequest("train", 2, map[resourcev1.QualifiedName]string{"memory": "20Gi"},
				`!(device.attributes["gpuslice.hami.io"].model.lowerAscii().contains("t4") || device.attributes["gpuslice.hami.io"].model.lowerAscii().contains("v100"))`,
				`!(device.attributes["gpuslice.hami.io"].uuid in ["GPU-bad"])`)},
			Constraints: []resourcev1.DeviceConstraint{{Requests: []string{"train"}, MatchAttribute: ptr.To(resourcev1.FullyQualifiedName("gpuslice.hami.io/numaNode"))}},
		}},
	}, {
		name: "whole GPU, a sidecar slice and a CPU container",
		pod: admitted(vgputest.Pod("p").Namespace("ml").Sidecar("proxy").MemoryMiB(1024).
			Container("main").GPU(1).Container("web").Limit(corev1.ResourceCPU, "1").Obj(), std),
		want: &resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
			gpuRequest("proxy", 1, map[resourcev1.QualifiedName]string{"memory": "1Gi"}),
			gpuRequest("main", 1, map[resourcev1.QualifiedName]string{"cores": "100"}),
		}}},
	}, {
		name: "pod in a DRA namespace selecting a device-plugin pool: not converted",
		pod:  admitted(vgputest.Pod("p").Namespace("ml").NodeSelector(vgpu.LabelNodeMode, "device-plugin").Container("main").GPU(1).Obj(), std),
	}, {
		name: "DRA off: a pod selecting the DRA pool is not converted",
		pod:  admitted(vgputest.Pod("p").NodeSelector(vgpu.LabelNodeMode, vgpu.NodeModeDRA).Container("main").GPU(1).Obj(), std),
		cfg:  ptr.To(webhook.DefaultConfig()),
	}, {
		name: "memory percentage",
		pod:  admitted(vgputest.Pod("p").Namespace("ml").Container("main").MemoryPercent(50).Obj(), std),
		deny: `container "main": hami.io/gpumem-percentage=50: is not served on DRA-mode nodes, whose claims ask for memory in bytes: use hami.io/gpumem (MiB) in containers main`,
	}, {
		name: "enforcement annotation and a claim of the same name",
		pod: func() *corev1.Pod {
			p := admitted(vgputest.Pod("p").Namespace("ml").Annotation(vgpu.AnnotationEnforcement, "required").Container("main").GPU(1).Obj(), std)
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpuslice", ResourceClaimName: ptr.To("mine")}}
			return p
		}(),
		deny: `annotation hami.io/enforcement: is not served on DRA-mode nodes (the DRA driver publishes no enforcement attribute yet); remove it, or select a device-plugin pool with nodeSelector gpuslice.hami.io/mode; ` +
			`spec.resourceClaims[name="gpuslice"]: the name is the claim gpuslice adds for the pod's hami.io resources; rename the pod's own claim`,
	}, {
		// vgpu's limit (MaxGPUContainersPerPod) is a claim's requests, so it refuses first.
		name: "more GPU containers than a claim has requests",
		pod: func() *corev1.Pod {
			b := vgputest.Pod("p").Namespace("ml")
			for i := range 33 {
				b = b.Container(fmt.Sprintf("c%d", i)).GPU(1)
			}
			return admitted(b.Obj(), std)
		}(),
		deny: `container "c32": hami.io/gpu=1: a pod may have at most 32 containers and init containers that ask for GPUs, and this is one more`,
	}, {
		name: "more GPUs in all than a claim is allocated",
		pod:  admitted(vgputest.Pod("p").Namespace("ml").Container("a").GPU(16).Container("b").GPU(16).Container("c").GPU(1).Obj(), std),
		deny: `the pod's containers ask for 33 GPUs (hami.io/gpu) in all: on DRA-mode nodes the pod's claim is allocated at most 32 devices; ` +
			`ask for fewer, or select a device-plugin pool with nodeSelector gpuslice.hami.io/mode`,
	}, {
		// vgpu's list limits keep a selector of printable models under the CEL limit, so they refuse first.
		name: "a model list whose selector would be longer than a claim allows",
		pod: admitted(vgputest.Pod("p").Namespace("ml").Annotation(vgpu.AnnotationGPUModelExclude, strings.TrimSuffix(strings.Repeat("m,", 200), ",")).
			Container("main").GPU(1).Obj(), std),
		deny: `hami.io/gpu-model-exclude="` + strings.Repeat("m,", 32) + `…" (399 bytes): must list at most 32 models, not 200`,
	}, {
		// Within vgpu's limits, control characters (four bytes each once quoted) still make too long a selector.
		name: "a model list within vgpu's limits whose quoted selector is longer than a claim allows",
		pod: admitted(vgputest.Pod("p").Namespace("ml").Annotation(vgpu.AnnotationGPUModel, strings.TrimSuffix(strings.Repeat(strings.Repeat("\x01", 96)+",", 32), ",")).
			Container("main").GPU(1).Obj(), std),
		deny: `annotation hami.io/gpu-model: its 32 entries make a CEL selector of 14620 bytes on DRA-mode nodes, where a selector has at most 10240; list fewer`,
	}, {
		name: "a container name the claim's request cannot have",
		pod:  admitted(vgputest.Pod("p").Namespace("ml").Container("Main_1").GPU(1).Obj(), std),
		deny: `container "Main_1": on DRA-mode nodes the name is that of its request in the pod's claim, so it must be a DNS label (at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit)`,
	}, {
		name: "invalid requests are denied as in device-plugin mode",
		pod:  admitted(vgputest.Pod("p").Namespace("ml").Container("main").Cores(150).Obj(), std),
		deny: `container "main": hami.io/gpucores=150: must be an integer from 1 to 100`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := draConfig()
			if tt.cfg != nil {
				cfg = *tt.cfg
			}
			got, err := webhook.Mutate(tt.pod, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if tt.deny != "" {
				if diff := cmp.Diff(webhook.Result{Message: tt.deny}, got); diff != "" {
					t.Errorf("Result (-want +got):\n%s", diff)
				}
				return
			}
			if !got.Allowed {
				t.Fatalf("denied: %s", got.Message)
			}
			if tt.want == nil {
				if got.Template != nil {
					t.Fatalf("converted to a claim from %+v, want the device-plugin path", got.Template.Spec)
				}
				return
			}
			if got.Template == nil {
				t.Fatal("no claim template: the pod was not converted")
			}
			if diff := cmp.Diff(*tt.want, got.Template.Spec.Spec); diff != "" {
				t.Errorf("template spec (-want +got):\n%s", diff)
			}
			if got.Template.Namespace != tt.pod.Namespace || !strings.HasPrefix(got.Template.Name, webhook.DRATemplatePrefix) {
				t.Errorf("template %s/%s, want %s/%s<hash>", got.Template.Namespace, got.Template.Name, tt.pod.Namespace, webhook.DRATemplatePrefix)
			}
			patched := applyWithAPIServerPatcher(t, tt.pod, got.Patch)
			wantClaims := []corev1.PodResourceClaim{{Name: webhook.DRAClaimName, ResourceClaimTemplateName: ptr.To(got.Template.Name)}}
			if diff := cmp.Diff(wantClaims, patched.Spec.ResourceClaims); diff != "" {
				t.Errorf("spec.resourceClaims (-want +got):\n%s", diff)
			}
			if patched.Spec.SchedulerName != std {
				t.Errorf("schedulerName %q, want the stock scheduler, which allocates claims", patched.Spec.SchedulerName)
			}
			if vgpu.AsksForGPU(patched) {
				t.Errorf("patched pod still asks for hami.io resources: %+v", patched.Spec)
			}
			for _, c := range append(append([]corev1.Container{}, patched.Spec.InitContainers...), patched.Spec.Containers...) {
				isGPU := false
				for _, r := range tt.want.Devices.Requests {
					isGPU = isGPU || r.Name == c.Name
				}
				var want []corev1.ResourceClaim
				if isGPU {
					want = []corev1.ResourceClaim{{Name: webhook.DRAClaimName, Request: c.Name}}
				}
				if diff := cmp.Diff(want, c.Resources.Claims); diff != "" {
					t.Errorf("container %s claims (-want +got):\n%s", c.Name, diff)
				}
			}
			again, err := webhook.Mutate(patched, cfg)
			if err != nil || !again.Skipped {
				t.Errorf("Mutate on the patched pod: %+v, %v; want skipped (the patch is idempotent)", again, err)
			}
		})
	}
}

// TestMutateDRASharedTemplate checks that two pods asking for the same slices share one template
// and that another size gets another.
func TestMutateDRASharedTemplate(t *testing.T) {
	name := func(mib int64) string {
		res, err := webhook.Mutate(vgputest.Pod("p").Namespace("ml").Container("main").MemoryMiB(mib).Obj(), draConfig())
		if err != nil || res.Template == nil {
			t.Fatalf("Mutate: %+v, %v", res, err)
		}
		return res.Template.Name
	}
	if a, b, c := name(4096), name(4096), name(8192); a != b || a == c {
		t.Errorf("template names %s, %s (same slice), %s (another): want the first two equal, the third different", a, b, c)
	}
}

// TestMutateDRAScore checks that with DRAConfig.Score a converted pod is steered to the gpuslice
// profile, whose extender scores its nodes, unless it names another scheduler, and that the patch
// stays idempotent.
func TestMutateDRAScore(t *testing.T) {
	cfg := draConfig()
	cfg.DRA.Score = true
	for _, tt := range []struct{ scheduler, want string }{
		{"", webhook.DefaultSchedulerName},
		{corev1.DefaultSchedulerName, webhook.DefaultSchedulerName},
		{"team-scheduler", "team-scheduler"},
	} {
		pod := vgputest.Pod("p").Namespace("ml").Container("main").MemoryMiB(4096).Obj()
		pod.Spec.SchedulerName = tt.scheduler
		res, err := webhook.Mutate(pod, cfg)
		if err != nil || res.Template == nil {
			t.Fatalf("Mutate: %+v, %v", res, err)
		}
		patched := applyWithAPIServerPatcher(t, pod, res.Patch)
		if patched.Spec.SchedulerName != tt.want {
			t.Errorf("schedulerName %q: patched to %q, want %q", tt.scheduler, patched.Spec.SchedulerName, tt.want)
		}
		if len(patched.Spec.ResourceClaims) != 1 {
			t.Errorf("schedulerName %q: claims %+v, want the pod claim", tt.scheduler, patched.Spec.ResourceClaims)
		}
		if again, err := webhook.Mutate(patched, cfg); err != nil || !again.Skipped {
			t.Errorf("Mutate on the patched pod: %+v, %v; want skipped", again, err)
		}
	}
}

// TestMutateDRASteerClaims checks that, with dra.steerClaims, a pod with native claims and no
// hami.io resource is steered to the gpuslice profile unless it names another scheduler, and that
// without it, or without claims, such a pod is left alone.
func TestMutateDRASteerClaims(t *testing.T) {
	native := func(scheduler string, claims bool) *corev1.Pod {
		pod := vgputest.Pod("native").Namespace("ml").Container("main").Obj()
		pod.Spec.SchedulerName = scheduler
		if claims {
			pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("a100-20g")}}
			pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		}
		return pod
	}
	steer := draConfig()
	steer.DRA.Score, steer.DRA.SteerClaims = true, true
	for _, tt := range []struct {
		name      string
		cfg       webhook.Config
		pod       *corev1.Pod
		want      string // "": skipped, unchanged
		wantPatch bool
	}{
		{"no scheduler", steer, native("", true), webhook.DefaultSchedulerName, true},
		{"the stock scheduler", steer, native(corev1.DefaultSchedulerName, true), webhook.DefaultSchedulerName, true},
		{"another scheduler", steer, native("team-scheduler", true), "team-scheduler", false},
		{"no claims", steer, native("", false), "", false},
		{"steering off", draConfig(), native("", true), "", false},
	} {
		res, err := webhook.Mutate(tt.pod, tt.cfg)
		if err != nil || !res.Allowed || res.Template != nil {
			t.Fatalf("%s: Mutate: %+v, %v; want allowed, no template", tt.name, res, err)
		}
		if got := len(res.Patch) > 0; got != tt.wantPatch || res.Skipped == tt.wantPatch {
			t.Fatalf("%s: patch %+v, skipped %t; want a patch: %t", tt.name, res.Patch, res.Skipped, tt.wantPatch)
		}
		patched := applyWithAPIServerPatcher(t, tt.pod, res.Patch)
		if patched.Spec.SchedulerName != tt.want {
			t.Errorf("%s: schedulerName %q, want %q", tt.name, patched.Spec.SchedulerName, tt.want)
		}
	}
}

func TestDRAConfigValidate(t *testing.T) {
	tests := []struct {
		dra  webhook.DRAConfig
		want string
	}{
		{webhook.DRAConfig{Enabled: true, Namespaces: []string{"*"}}, ""},
		{webhook.DRAConfig{Namespaces: []string{"ml"}}, `dra.namespaces="ml": needs dra.enabled: true`},
		{webhook.DRAConfig{Enabled: true, Namespaces: []string{"ml", "*"}}, `dra.namespaces="*": "*" (every namespace) must be the only entry`},
		{webhook.DRAConfig{Enabled: true, Namespaces: []string{"ML"}}, `dra.namespaces="ML": each entry must be a namespace name`},
		{webhook.DRAConfig{Enabled: true, DeviceClassName: "Bad Class"}, `dra.deviceClassName="Bad Class": must be a DeviceClass name`},
		{webhook.DRAConfig{Score: true}, `dra.score="true": needs dra.enabled: true`},
		{webhook.DRAConfig{Enabled: true, SteerClaims: true}, `dra.steerClaims="true": needs dra.score: true`},
	}
	for _, tt := range tests {
		cfg := webhook.DefaultConfig()
		cfg.DRA = tt.dra
		err := cfg.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: %v, want valid", tt.dra, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: %v, want an error containing %q", tt.dra, err, tt.want)
		}
	}
}

// recordingTemplates is a Templates that records what it is asked to create.
type recordingTemplates struct {
	mu      sync.Mutex
	created []string
	err     error
}

func (r *recordingTemplates) Ensure(_ context.Context, t *resourcev1.ResourceClaimTemplate) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.created = append(r.created, t.Namespace+"/"+t.Name)
	return r.err
}

// TestHandlerDRATemplates checks that the handler creates the template before it admits a
// converted pod, creates nothing on a dry run, and refuses the pod when the template cannot be
// made; and that DRA mode without Templates is refused at construction.
func TestHandlerDRATemplates(t *testing.T) {
	if _, err := webhook.NewHandlerWithTemplates(draConfig(), nil); !errors.Is(err, webhook.ErrNoTemplates) {
		t.Errorf("NewHandlerWithTemplates without Templates: %v, want ErrNoTemplates", err)
	}
	pod := vgputest.Pod("p").Namespace("ml").Container("main").MemoryMiB(2048).Obj()
	tests := []struct {
		name        string
		dryRun      bool
		ensureErr   error
		wantAllowed bool
		wantCreated int
		wantCode    int32
	}{
		{"created, then admitted", false, nil, true, 1, 0},
		{"dry run: nothing created", true, nil, true, 0, 0},
		{"creation fails: refused", false, errors.New("forbidden"), false, 1, http.StatusInternalServerError},
		{"another template holds the name: refused", false, fmt.Errorf("ResourceClaimTemplate ml/x %w: forbidden", webhook.ErrTemplateConflict), false, 1, http.StatusConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recordingTemplates{err: tt.ensureErr}
			h, err := webhook.NewHandlerWithTemplates(draConfig(), rec)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			resp := admit(t, srv.URL, pod, tt.dryRun)
			if resp.Allowed != tt.wantAllowed {
				t.Errorf("allowed %t, want %t (%+v)", resp.Allowed, tt.wantAllowed, resp)
			}
			if !tt.wantAllowed && (resp.Code != tt.wantCode || !strings.Contains(resp.Message, "forbidden")) {
				t.Errorf("answer %+v, want %d naming the cause", resp, tt.wantCode)
			}
			if len(rec.created) != tt.wantCreated {
				t.Errorf("templates created %v, want %d", rec.created, tt.wantCreated)
			}
		})
	}
}

// admit posts a pod CREATE review of pod (a dry run when dryRun) and returns the decoded answer.
func admit(t *testing.T, url string, pod *corev1.Pod, dryRun bool) reviewSummary {
	t.Helper()
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "uid-1", Kind: podKind, Operation: admissionv1.Create, Namespace: pod.Namespace, DryRun: ptr.To(dryRun),
			Object: runtime.RawExtension{Object: pod},
		},
	}
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url+webhook.MutatePath, "application/json", bytes.NewReader(body)) //nolint:noctx // test server
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return summarize(t, out)
}

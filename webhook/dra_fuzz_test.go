package webhook_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/webhook"
)

// templateBytesPerByte bounds the JSON of one request of a claim template per byte of the pod:
// a model of one letter and its comma become a CEL call of about 60 bytes, repeated in every
// request (one per GPU container), whose number the API server bounds.
const (
	templateBytesPerByte = 32
	templateBytesBase    = 1024
)

// draFuzzPods seeds FuzzMutateDRA beyond hamiPods and fuzzPods: pods converted to claims, at the
// API server's limits on a claim and past them.
func draFuzzPods() []string {
	gpuContainers := func(n, gpus int) string {
		var cs []string
		for i := range n {
			cs = append(cs, fmt.Sprintf(`{"name":"c%d","resources":{"limits":{"hami.io/gpu":"%d","hami.io/gpumem":"1024"}}}`, i, gpus))
		}
		return `{"metadata":{"name":"p"},"spec":{"containers":[` + strings.Join(cs, ",") + `]}}`
	}
	models := func(n int) string {
		return strings.TrimSuffix(strings.Repeat("m,", n), ",")
	}
	return []string{
		`{"metadata":{"name":"p","annotations":{"hami.io/gpu-model":"A100","hami.io/gpu-uuid":"GPU-a,GPU-b","hami.io/numa-bind":"true"}},"spec":{"containers":[{"name":"train","resources":{"limits":{"hami.io/gpu":"2","hami.io/gpumem":"20Gi","hami.io/gpucores":"30"}}}]}}`,
		`{"metadata":{"name":"p","annotations":{"hami.io/gpu-model-exclude":"T4,V100","hami.io/gpu-uuid-exclude":"GPU-bad"}},"spec":{"nodeSelector":{"gpuslice.hami.io/mode":"dra"},"initContainers":[{"name":"side","restartPolicy":"Always","resources":{"limits":{"hami.io/gpumem":"512"}}}],"containers":[{"name":"main","resources":{"limits":{"hami.io/gpu":"1"},"claims":[{"name":"own"}]}}],"resourceClaims":[{"name":"own","resourceClaimName":"mine"}]}}`,
		`{"metadata":{"name":"p"},"spec":{"nodeSelector":{"gpuslice.hami.io/mode":"device-plugin"},"containers":[{"name":"c","resources":{"limits":{"hami.io/gpu":"1"}}}]}}`,
		`{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"hami.io/gpumem-percentage":"50"}}}],"resourceClaims":[{"name":"gpuslice"}]}}`,
		gpuContainers(32, 1), gpuContainers(33, 1), gpuContainers(2, 16), gpuContainers(3, 16),
		`{"metadata":{"name":"p","annotations":{"hami.io/gpu-model":"` + models(150) + `","hami.io/gpu-model-exclude":"` + models(200) + `"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"hami.io/gpu":"1"}}}]}}`,
		`{"metadata":{"name":"p"},"spec":{"containers":[{"name":"Not_A_Label","resources":{"limits":{"hami.io/gpu":"1"}}}]}}`,
	}
}

// FuzzMutateDRA fuzzes the conversion to a claim (Config.DRA, every namespace, with and without
// HAMiCompat). Beyond checkMutate: a converted pod's template is named after the hash of its spec,
// in the pod's namespace, labelled as the webhook's; it is within the API server's limits on a
// claim (requests, devices in all, request names, selectors that compile within CEL's length and
// cost limits, constraints); its JSON is bounded per request by the pod's size; the patched pod
// names it once, each of its requests is claimed by the container of that name and no hami.io
// resource is left.
func FuzzMutateDRA(f *testing.F) {
	for _, p := range slices.Concat(draFuzzPods(), hamiPods, fuzzPods) {
		f.Add(p, false)
		f.Add(p, true)
	}
	compiler := cel.GetCompiler(cel.Features{EnableConsumableCapacity: true})
	f.Fuzz(func(t *testing.T, s string, hami bool) {
		pod, ok := decodeFuzzPod(s, "ml")
		if !ok {
			return
		}
		cfg := webhook.DefaultConfig()
		cfg.HAMiCompat = hami
		cfg.DRA = webhook.DRAConfig{Enabled: true, Namespaces: []string{"*"}, Score: true}
		res, patched := checkMutate(t, pod, cfg, len(s))
		if res.Template == nil {
			return
		}
		checkTemplate(t, compiler, res.Template, pod.Namespace, len(s))
		checkClaimedPod(t, patched, res.Template)
	})
}

// checkTemplate checks tmpl, made for a pod of n bytes in namespace ns, against what the webhook
// promises and the API server (k8s.io/kubernetes pkg/apis/resource/validation) and its allocator
// require.
func checkTemplate(t *testing.T, compiler interface {
	CompileCELExpression(string, cel.Options) cel.CompilationResult
}, tmpl *resourcev1.ResourceClaimTemplate, ns string, n int) {
	t.Helper()
	spec := tmpl.Spec.Spec
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if want := webhook.DRATemplatePrefix + hex.EncodeToString(sum[:8]); tmpl.Name != want || tmpl.Namespace != ns || tmpl.Labels[webhook.LabelDRATemplate] != "true" {
		t.Fatalf("template %s/%s labels %v, want %s/%s labelled %s=true", tmpl.Namespace, tmpl.Name, tmpl.Labels, ns, want, webhook.LabelDRATemplate)
	}
	reqs := spec.Devices.Requests
	if len(reqs) == 0 || len(reqs) > resourcev1.DeviceRequestsMaxSize {
		t.Fatalf("template with %d requests, want 1 to %d", len(reqs), resourcev1.DeviceRequestsMaxSize)
	}
	if limit := len(reqs) * (templateBytesPerByte*n + templateBytesBase); len(raw) > limit {
		t.Fatalf("a %d-byte pod got a %d-byte template of %d requests, want at most %d", n, len(raw), len(reqs), limit)
	}
	devices := int64(0)
	var names []string
	for _, r := range reqs {
		x := r.Exactly
		if msgs := validation.IsDNS1123Label(r.Name); len(msgs) > 0 || slices.Contains(names, r.Name) {
			t.Fatalf("request name %q: %v, or repeated in %q", r.Name, msgs, names)
		}
		names = append(names, r.Name)
		if x == nil || x.DeviceClassName != webhook.DefaultDRADeviceClass || x.AllocationMode != resourcev1.DeviceAllocationModeExactCount || x.Count < 1 || x.Count > vgpu.MaxGPUsPerContainer {
			t.Fatalf("request %s: %+v, want exactly 1 to %d devices of class %s", r.Name, x, vgpu.MaxGPUsPerContainer, webhook.DefaultDRADeviceClass)
		}
		devices += x.Count
		if len(x.Selectors) > resourcev1.DeviceSelectorsMaxSize {
			t.Fatalf("request %s: %d selectors, want at most %d", r.Name, len(x.Selectors), resourcev1.DeviceSelectorsMaxSize)
		}
		for _, sel := range x.Selectors {
			expr := sel.CEL.Expression
			if len(expr) > resourcev1.CELSelectorExpressionMaxLength {
				t.Fatalf("request %s: a %d-byte selector, want at most %d", r.Name, len(expr), resourcev1.CELSelectorExpressionMaxLength)
			}
			if c := compiler.CompileCELExpression(expr, cel.Options{}); c.Error != nil || c.MaxCost > resourcev1.CELSelectorExpressionMaxCost {
				t.Fatalf("request %s: selector %q: %v, cost %d (limit %d)", r.Name, expr, c.Error, c.MaxCost, resourcev1.CELSelectorExpressionMaxCost)
			}
		}
		if x.Capacity != nil {
			for name, q := range x.Capacity.Requests {
				if q.Sign() <= 0 {
					t.Fatalf("request %s: capacity %s=%s, want above 0", r.Name, name, q.String())
				}
			}
		}
	}
	if devices > resourcev1.AllocationResultsMaxSize {
		t.Fatalf("template asks for %d devices in all; a claim is allocated at most %d", devices, resourcev1.AllocationResultsMaxSize)
	}
	if len(spec.Devices.Constraints) > resourcev1.DeviceConstraintsMaxSize {
		t.Fatalf("template with %d constraints, want at most %d", len(spec.Devices.Constraints), resourcev1.DeviceConstraintsMaxSize)
	}
	for _, c := range spec.Devices.Constraints {
		for _, r := range c.Requests {
			if !slices.Contains(names, r) {
				t.Fatalf("constraint %+v names request %q, not among %q", c, r, names)
			}
		}
	}
}

// checkClaimedPod checks the pod the API server makes of a converted pod's patch.
func checkClaimedPod(t *testing.T, pod *corev1.Pod, tmpl *resourcev1.ResourceClaimTemplate) {
	t.Helper()
	var ours []corev1.PodResourceClaim
	for _, c := range pod.Spec.ResourceClaims {
		if c.Name == webhook.DRAClaimName {
			ours = append(ours, c)
		}
	}
	if len(ours) != 1 || ours[0].ResourceClaimTemplateName == nil || *ours[0].ResourceClaimTemplateName != tmpl.Name {
		t.Fatalf("patched pod's claims %+v, want one %s from template %s", pod.Spec.ResourceClaims, webhook.DRAClaimName, tmpl.Name)
	}
	if vgpu.AsksForGPU(pod) {
		t.Fatalf("patched pod still asks for hami.io resources: %+v", pod.Spec)
	}
	claimed := map[string]int{}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, rc := range c.Resources.Claims {
			if rc.Name != webhook.DRAClaimName {
				continue
			}
			if rc.Request != c.Name {
				t.Fatalf("container %q claims request %q of %s, want its own", c.Name, rc.Request, webhook.DRAClaimName)
			}
			claimed[rc.Request]++
		}
	}
	for _, r := range tmpl.Spec.Spec.Devices.Requests {
		if claimed[r.Name] != 1 {
			t.Fatalf("request %q is claimed by %d containers, want 1 (claims %v)", r.Name, claimed[r.Name], claimed)
		}
	}
	if len(claimed) != len(tmpl.Spec.Spec.Devices.Requests) {
		t.Fatalf("containers claim requests %v, the template has %d", claimed, len(tmpl.Spec.Spec.Devices.Requests))
	}
}

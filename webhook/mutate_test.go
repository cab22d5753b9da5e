package webhook_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
	"github.com/gpuslice/gpuslice/webhook"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/patches")

// admitted returns pod as the webhook sees it at creation: the API server
// has copied limits into missing requests and, unless scheduler is "",
// set spec.schedulerName.
func admitted(pod *corev1.Pod, scheduler string) *corev1.Pod {
	pod.Spec.SchedulerName = scheduler
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			res := &list[i].Resources
			for name, q := range res.Limits {
				if _, ok := res.Requests[name]; ok {
					continue
				}
				if res.Requests == nil {
					res.Requests = corev1.ResourceList{}
				}
				res.Requests[name] = q
			}
		}
	}
	return pod
}

// patchCase is a pod the webhook admits; its patch is a golden file.
type patchCase struct {
	name string
	pod  *corev1.Pod
}

func patchCases() []patchCase {
	const std = corev1.DefaultSchedulerName
	return []patchCase{
		{"memory-mib", admitted(vgputest.Pod("p").MemoryMiB(10240).Obj(), std)},
		{"memory-unit", admitted(vgputest.Pod("p").Limit(vgpu.ResourceMemory, "10Gi").Cores(30).Obj(), std)},
		{"memory-unit-no-scheduler", admitted(vgputest.Pod("p").GPU(2).Limit(vgpu.ResourceMemory, "512Mi").Obj(), "")},
		{"requests-only", vgputest.Pod("p").Request(vgpu.ResourceMemory, "4Gi").Obj()},
		{"percent-other-scheduler", admitted(vgputest.Pod("p").MemoryPercent(50).Obj(), "volcano")},
		{"whole-gpu", admitted(vgputest.Pod("p").GPU(1).Obj(), std)},
		{"already-patched", admitted(vgputest.Pod("p").GPU(1).MemoryMiB(10240).Obj(), webhook.DefaultSchedulerName)},
		{"sidecar-and-containers", admitted(vgputest.Pod("p").
			Sidecar("proxy").Limit(vgpu.ResourceMemory, "1Gi").
			Container("train").GPU(2).Limit(vgpu.ResourceMemory, "20Gi").Cores(50).
			Container("eval").Cores(10).
			Container("web").Limit(corev1.ResourceCPU, "1").Obj(), std)},
		{"placement-annotations", admitted(vgputest.Pod("p").
			Annotation(vgpu.AnnotationGPUModel, "A100,H100").
			Annotation(vgpu.AnnotationGPUPolicy, string(vgpu.PolicySpread)).
			MemoryMiB(2048).Obj(), std)},
	}
}

func TestMutate(t *testing.T) {
	const std = corev1.DefaultSchedulerName
	allowed := func(ops ...webhook.JSONPatchOp) webhook.Result {
		if len(ops) == 0 {
			ops = nil
		}
		return webhook.Result{Patch: ops, Allowed: true}
	}
	skipped := webhook.Result{Allowed: true, Skipped: true}
	denied := func(msg string) webhook.Result { return webhook.Result{Message: msg} }
	setScheduler := webhook.JSONPatchOp{Op: "replace", Path: "/spec/schedulerName", Value: "gpuslice-scheduler"}
	tests := []struct {
		name string
		pod  *corev1.Pod
		cfg  *webhook.Config
		want webhook.Result
	}{{
		name: "no GPU resource: skipped",
		pod:  admitted(vgputest.Pod("p").Limit(corev1.ResourceCPU, "1").Limit("nvidia.com/gpu", "1").Obj(), std),
		want: skipped,
	}, {
		name: "excluded namespace: skipped, even when invalid",
		pod:  admitted(vgputest.Pod("p").Namespace("kube-system").Cores(150).Annotation(vgpu.AnnotationPodAllocation, "{}").Obj(), std),
		want: skipped,
	}, {
		name: "namespace excluded by config",
		pod:  admitted(vgputest.Pod("p").Namespace("batch").MemoryMiB(1024).Obj(), std),
		cfg:  &webhook.Config{SchedulerName: "gpu", ExcludedNamespaces: []string{"batch"}},
		want: skipped,
	}, {
		name: "no excluded namespace: kube-system is mutated",
		pod:  admitted(vgputest.Pod("p").Namespace("kube-system").GPU(1).Obj(), std),
		cfg:  &webhook.Config{SchedulerName: "gpu"},
		want: allowed(webhook.JSONPatchOp{Op: "replace", Path: "/spec/schedulerName", Value: "gpu"}),
	}, {
		name: "memory in MiB: scheduler set, hami.io/gpu added to limits and requests",
		pod:  admitted(vgputest.Pod("p").MemoryMiB(10240).Obj(), std),
		want: allowed(setScheduler,
			webhook.JSONPatchOp{Op: "add", Path: "/spec/containers/0/resources/limits/hami.io~1gpu", Value: "1"},
			webhook.JSONPatchOp{Op: "add", Path: "/spec/containers/0/resources/requests/hami.io~1gpu", Value: "1"}),
	}, {
		name: "memory with a unit: converted to MiB",
		pod:  admitted(vgputest.Pod("p").GPU(1).Limit(vgpu.ResourceMemory, "10Gi").Obj(), "volcano"),
		want: allowed(
			webhook.JSONPatchOp{Op: "replace", Path: "/spec/containers/0/resources/limits/hami.io~1gpumem", Value: "10240"},
			webhook.JSONPatchOp{Op: "replace", Path: "/spec/containers/0/resources/requests/hami.io~1gpumem", Value: "10240"}),
	}, {
		name: "limits only (no API defaulting): hami.io/gpu added to limits only",
		pod:  vgputest.Pod("p").Cores(20).Obj(),
		want: allowed(
			webhook.JSONPatchOp{Op: "add", Path: "/spec/schedulerName", Value: "gpuslice-scheduler"},
			webhook.JSONPatchOp{Op: "add", Path: "/spec/containers/0/resources/limits/hami.io~1gpu", Value: "1"}),
	}, {
		name: "requests only: limits created",
		pod:  vgputest.Pod("p").Request(vgpu.ResourceCores, "20").Obj(),
		want: allowed(
			webhook.JSONPatchOp{Op: "add", Path: "/spec/schedulerName", Value: "gpuslice-scheduler"},
			webhook.JSONPatchOp{Op: "add", Path: "/spec/containers/0/resources/limits", Value: map[string]string{"hami.io/gpu": "1"}},
			webhook.JSONPatchOp{Op: "add", Path: "/spec/containers/0/resources/requests/hami.io~1gpu", Value: "1"}),
	}, {
		name: "hami.io/gpu only in requests: not added again",
		pod:  vgputest.Pod("p").Request(vgpu.ResourceGPU, "1").Cores(20).Obj(),
		want: allowed(webhook.JSONPatchOp{Op: "add", Path: "/spec/schedulerName", Value: "gpuslice-scheduler"}),
	}, {
		name: "another scheduler and nothing to default: no patch",
		pod:  admitted(vgputest.Pod("p").GPU(1).MemoryMiB(1024).Obj(), "volcano"),
		want: allowed(),
	}, {
		name: "sidecar gets defaults",
		pod:  admitted(vgputest.Pod("p").Sidecar("proxy").MemoryPercent(10).Container("main").GPU(1).Obj(), webhook.DefaultSchedulerName),
		want: allowed(
			webhook.JSONPatchOp{Op: "add", Path: "/spec/initContainers/0/resources/limits/hami.io~1gpu", Value: "1"},
			webhook.JSONPatchOp{Op: "add", Path: "/spec/initContainers/0/resources/requests/hami.io~1gpu", Value: "1"}),
	}, {
		name: "forged allocation annotation",
		pod:  admitted(vgputest.Pod("p").Annotation(vgpu.AnnotationPodAllocation, `{"version":1}`).GPU(1).Obj(), std),
		want: denied(`annotation hami.io/gpu-allocation="{\"version\":1}": must not be set when the pod is created: only the gpuslice scheduler extender writes it, when it binds the pod`),
	}, {
		name: "forged allocation annotation on a pod without GPUs, long value shortened",
		pod:  admitted(vgputest.Pod("p").Annotation(vgpu.AnnotationPodAllocation, strings.Repeat("x", 100)).Container("main").Obj(), std),
		want: denied(`annotation hami.io/gpu-allocation="` + strings.Repeat("x", 64) + `…": must not be set when the pod is created: only the gpuslice scheduler extender writes it, when it binds the pod`),
	}, {
		name: "invalid placement annotations",
		pod: admitted(vgputest.Pod("p").Annotation(vgpu.AnnotationNUMABind, "yes").
			Annotation(vgpu.AnnotationGPUPolicy, "pack").GPU(1).Obj(), std),
		want: denied(`hami.io/numa-bind="yes": must be "true" or "false"; hami.io/gpu-policy="pack": must be one of binpack, spread, fragmentation`),
	}, {
		name: "200 KiB exclude list: denied with the key, the limit and the length, the value cut",
		pod:  admitted(vgputest.Pod("p").Annotation(vgpu.AnnotationGPUModelExclude, strings.Repeat("40GB,", 40960)).GPU(1).Obj(), std),
		want: denied(`hami.io/gpu-model-exclude="` + strings.Repeat("40GB,", 12) + `40GB…" (204800 bytes): must be at most 4096 bytes: at most 32 models of at most 96 bytes each`),
	}, {
		name: "33 UUIDs",
		pod:  admitted(vgputest.Pod("p").Annotation(vgpu.AnnotationGPUUUID, uuids(33)).GPU(1).Obj(), std),
		want: denied(`hami.io/gpu-uuid="` + uuids(33)[:64] + `…" (1352 bytes): must list at most 32 GPU UUIDs, not 33`),
	}, {
		name: "32 UUIDs: allowed",
		pod:  admitted(vgputest.Pod("p").Annotation(vgpu.AnnotationGPUUUID, uuids(32)).GPU(1).Obj(), std),
		want: allowed(setScheduler),
	}, {
		name: "a model name longer than NVML's",
		pod:  admitted(vgputest.Pod("p").Annotation(vgpu.AnnotationGPUModel, "H100,"+strings.Repeat("A", 100)).GPU(1).Obj(), std),
		want: denied(`hami.io/gpu-model="H100,` + strings.Repeat("A", 59) + `…" (105 bytes): each of the models must be at most 96 bytes: item 2 is 100 bytes`),
	}, {
		name: "33 GPU containers",
		pod:  admitted(gpuContainers(33).Obj(), std),
		want: denied(`container "c32": hami.io/gpu=1: a pod may have at most 32 containers and init containers that ask for GPUs, and this is one more`),
	}, {
		name: "many invalid containers: the first problems, then a count",
		pod:  admitted(unknownResources(20).Obj(), std),
		want: denied(strings.Repeat(`container "c": hami.io/gpumemory=1: unknown gpuslice resource: must be one of hami.io/gpu, hami.io/gpumem, hami.io/gpumem-percentage, hami.io/gpucores; `, 16) +
			"and 4 more problems"),
	}, {
		name: "invalid enforcement requirement",
		pod:  admitted(vgputest.Pod("p").Annotation(vgpu.AnnotationEnforcement, "strict").GPU(1).Obj(), std),
		want: denied(`hami.io/enforcement="strict": must be "required" (any mechanism) or one of driver, hami-core, mps (that mechanism only); leave it unset to accept any node`),
	}, {
		name: "enforcement required: allowed",
		pod:  admitted(vgputest.Pod("p").Annotation(vgpu.AnnotationEnforcement, "required").GPU(1).Obj(), std),
		want: allowed(setScheduler),
	}, {
		name: "GPU in a regular init container: suggest a sidecar",
		pod:  admitted(vgputest.Pod("p").InitContainer("warmup").MemoryMiB(2048).Container("main").GPU(1).Obj(), std),
		want: denied(`init container "warmup": hami.io/gpumem=2048: a regular init container cannot get a GPU slice, as gpuslice cannot hand it its own slice exactly; make it a sidecar (an init container with restartPolicy: Always) or do the GPU work in an app container`),
	}, {
		name: "spec.nodeName preset: the scheduler is bypassed",
		pod:  admitted(vgputest.Pod("p").NodeName("node-1").GPU(1).Obj(), std),
		want: denied(`spec.nodeName="node-1": must be empty for a pod that asks for hami.io resources: only the gpuslice scheduler gives a pod its GPU slice, when it binds it; to pick the node, use a nodeSelector on kubernetes.io/hostname or node affinity`),
	}, {
		name: "spec.nodeName preset on a pod without GPUs: skipped",
		pod:  admitted(vgputest.Pod("p").NodeName("node-1").Container("main").Obj(), std),
		want: webhook.Result{Allowed: true, Skipped: true},
	}, {
		name: "cores out of range",
		pod:  admitted(vgputest.Pod("p").Cores(150).Obj(), std),
		want: denied(`container "main": hami.io/gpucores=150: must be an integer from 1 to 100`),
	}, {
		name: "memory not a whole MiB",
		pod:  admitted(vgputest.Pod("p").Limit(vgpu.ResourceMemory, "1536Ki").Obj(), std),
		want: denied(`container "main": hami.io/gpumem=1536Ki: must be a whole number of MiB from 1 to 16777216: a plain number is MiB (10240), a binary suffix means bytes (10Gi)`),
	}, {
		name: "memory with a decimal suffix reads as MiB: too large",
		pod:  admitted(vgputest.Pod("p").Limit(vgpu.ResourceMemory, "10G").Obj(), std),
		want: denied(`container "main": hami.io/gpumem=10G: must be a whole number of MiB from 1 to 16777216: a plain number is MiB (10240), a binary suffix means bytes (10Gi)`),
	}, {
		name: "memory with a unit above the maximum: the user's value is named",
		pod:  admitted(vgputest.Pod("p").Limit(vgpu.ResourceMemory, "32Ti").Obj(), std),
		want: denied(`container "main": hami.io/gpumem=32Ti: must be a whole number of MiB from 1 to 16777216: a plain number is MiB (10240), a binary suffix means bytes (10Gi)`),
	}, {
		name: "unknown hami.io resource",
		pod:  admitted(vgputest.Pod("p").Limit("hami.io/gpumemory", "10Gi").Obj(), std),
		want: denied(`container "main": hami.io/gpumemory=10Gi: unknown gpuslice resource: must be one of hami.io/gpu, hami.io/gpumem, hami.io/gpumem-percentage, hami.io/gpucores`),
	}, {
		name: "every problem at once",
		pod: admitted(vgputest.Pod("p").Annotation(vgpu.AnnotationNodePolicy, "x").
			InitContainer("init").GPU(1).
			Container("a").MemoryMiB(1024).MemoryPercent(50).
			Container("b").GPU(17).Obj(), std),
		want: denied(`hami.io/node-policy="x": must be one of binpack, spread, fragmentation; ` +
			`init container "init": hami.io/gpu=1: a regular init container cannot get a GPU slice, as gpuslice cannot hand it its own slice exactly; make it a sidecar (an init container with restartPolicy: Always) or do the GPU work in an app container; ` +
			`container "a": hami.io/gpumem=1024: must not be set together with hami.io/gpumem-percentage (50): set one of them; ` +
			`container "b": hami.io/gpu=17: must be an integer from 1 to 16`),
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := webhook.DefaultConfig()
			if tt.cfg != nil {
				cfg = *tt.cfg
			}
			before := tt.pod.DeepCopy()
			got, err := webhook.Mutate(tt.pod, cfg)
			if err != nil {
				t.Fatalf("Mutate: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Mutate mismatch (-want +got):\n%s", diff)
			}
			if !equalJSON(t, before, tt.pod) {
				t.Errorf("Mutate modified its input pod")
			}
		})
	}
}

// uuids is n GPU UUIDs, comma-separated.
func uuids(n int) string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i)
	}
	return strings.Join(out, ",")
}

// gpuContainers is a pod of n containers, c0 … c(n-1), that ask for a GPU.
func gpuContainers(n int) *vgputest.PodBuilder {
	b := vgputest.Pod("p")
	for i := range n {
		b.Container(fmt.Sprintf("c%d", i)).GPU(1)
	}
	return b
}

// unknownResources is a pod of n containers named c that ask for an
// unknown hami.io resource.
func unknownResources(n int) *vgputest.PodBuilder {
	b := vgputest.Pod("p")
	for range n {
		b.Container("c").Limit("hami.io/gpumemory", "1")
	}
	return b
}

func TestMutateErrors(t *testing.T) {
	if _, err := webhook.Mutate(nil, webhook.DefaultConfig()); err == nil {
		t.Errorf("Mutate(nil pod): got no error")
	}
	pod := vgputest.Pod("p").GPU(1).Obj()
	if _, err := webhook.Mutate(pod, webhook.Config{}); err == nil || !strings.Contains(err.Error(), "schedulerName") {
		t.Errorf("Mutate(zero Config): got %v, want an error naming schedulerName", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  webhook.Config
		want string // "" for valid
	}{
		{"default", webhook.DefaultConfig(), ""},
		{"no excluded namespaces", webhook.Config{SchedulerName: "gpu-profile"}, ""},
		{"empty scheduler", webhook.Config{}, `invalid config: schedulerName="": required: the scheduler profile that calls the gpuslice extender, e.g. gpuslice-scheduler`},
		{"stock scheduler", webhook.Config{SchedulerName: "default-scheduler"}, `invalid config: schedulerName="default-scheduler": must not be the stock profile: GPU pods must reach the profile that calls the gpuslice extender`},
		{"bad scheduler", webhook.Config{SchedulerName: "GPU Scheduler"}, `invalid config: schedulerName="GPU Scheduler": must be a valid scheduler name (a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*'))`},
		{"bad namespaces", webhook.Config{SchedulerName: "s", ExcludedNamespaces: []string{"ok", "", "a.b"}},
			"invalid config: excludedNamespaces=\"\": each entry must be a namespace name (lower-case letters, digits and '-', at most 63)\n" +
				`invalid config: excludedNamespaces="a.b": each entry must be a namespace name (lower-case letters, digits and '-', at most 63)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if err := tt.cfg.Validate(); err != nil {
				got = err.Error()
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Validate mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGoldenPatches(t *testing.T) {
	for _, tc := range patchCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := webhook.Mutate(tc.pod, webhook.DefaultConfig())
			if err != nil || !got.Allowed {
				t.Fatalf("Mutate: %+v, %v; want allowed", got, err)
			}
			ops := got.Patch
			if ops == nil {
				ops = []webhook.JSONPatchOp{}
			}
			encoded, err := json.MarshalIndent(ops, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			encoded = append(encoded, '\n')
			path := filepath.Join("testdata", "patches", tc.name+".json")
			if *update {
				if err := os.WriteFile(path, encoded, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			golden, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden file (regenerate with go test ./webhook -update): %v", err)
			}
			if diff := cmp.Diff(string(golden), string(encoded)); diff != "" {
				t.Errorf("%s is stale; regenerate with go test ./webhook -update (-want +got):\n%s", path, diff)
			}
		})
	}
}

// TestMutateIdempotent applies each patch to the pod's JSON, as the API
// server does, and checks that Mutate then has nothing left to change.
func TestMutateIdempotent(t *testing.T) {
	for _, tc := range patchCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			first, err := webhook.Mutate(tc.pod, webhook.DefaultConfig())
			if err != nil || !first.Allowed {
				t.Fatalf("Mutate: %+v, %v; want allowed", first, err)
			}
			patched := applyPatch(t, tc.pod, first.Patch)
			if _, err := vgpu.RequestFromPod(patched); err != nil {
				t.Errorf("RequestFromPod of the patched pod: %v", err)
			}
			second, err := webhook.Mutate(patched, webhook.DefaultConfig())
			if err != nil {
				t.Fatalf("Mutate of the patched pod: %v", err)
			}
			if diff := cmp.Diff(webhook.Result{Allowed: true}, second); diff != "" {
				t.Errorf("Mutate of the patched pod (-want +got):\n%s", diff)
			}
		})
	}
}

// applyPatch applies add and replace ops (RFC 6902) to pod's JSON and
// decodes the result.
func applyPatch(t *testing.T, pod *corev1.Pod, ops []webhook.JSONPatchOp) *corev1.Pod {
	t.Helper()
	doc := toJSONValue(t, pod)
	for _, op := range ops {
		if err := applyOp(doc, op, toJSONValue(t, op.Value)); err != nil {
			t.Fatalf("apply %+v: %v", op, err)
		}
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var out corev1.Pod
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("decode patched pod: %v", err)
	}
	return &out
}

func applyOp(doc any, op webhook.JSONPatchOp, value any) error {
	if !strings.HasPrefix(op.Path, "/") {
		return fmt.Errorf("path %q: must start with /", op.Path)
	}
	tokens := strings.Split(op.Path[1:], "/")
	for i, tok := range tokens {
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
	}
	cur := doc
	for _, tok := range tokens[:len(tokens)-1] {
		switch node := cur.(type) {
		case map[string]any:
			next, ok := node[tok]
			if !ok {
				return fmt.Errorf("path %q: no member %q", op.Path, tok)
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(node) {
				return fmt.Errorf("path %q: bad index %q", op.Path, tok)
			}
			cur = node[i]
		default:
			return fmt.Errorf("path %q: %q is not in an object or array", op.Path, tok)
		}
	}
	parent, ok := cur.(map[string]any)
	if !ok {
		return fmt.Errorf("path %q: parent is not an object (this applier does not add to arrays)", op.Path)
	}
	last := tokens[len(tokens)-1]
	switch op.Op {
	case "add":
	case "replace":
		if _, ok := parent[last]; !ok {
			return fmt.Errorf("path %q: replace of a missing member", op.Path)
		}
	default:
		return fmt.Errorf("op %q: unsupported", op.Op)
	}
	parent[last] = value
	return nil
}

func toJSONValue(t *testing.T, v any) any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	x, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

package webhook_test

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/fuzzcost"
	"github.com/gpuslice/gpuslice/webhook"
)

// Bounds of the conversion fuzzers, per byte of the pod's JSON. A patch op names a path of the
// pod's (a few tens of bytes) for a resource or annotation that took a few tens of bytes to write;
// Mutate allocates for each resource, annotation and op (about 1 per byte measured on the seeds
// and the fuzzers' finds).
const (
	patchBytesPerByte = 16
	patchBytesBase    = 1024
	mutateAllocsBase  = 256
	mutateAllocsPer   = 4
)

// decodeFuzzPod decodes a fuzzed pod as the handler does, in namespace ns when it names none;
// false for JSON that is no pod (FuzzAdmissionPod covers those).
func decodeFuzzPod(s, ns string) (*corev1.Pod, bool) {
	pod := &corev1.Pod{}
	if err := json.Unmarshal([]byte(s), pod); err != nil {
		return nil, false
	}
	if pod.Namespace == "" {
		pod.Namespace = ns
	}
	return pod, true
}

// checkMutate calls Mutate on pod (decoded from n bytes) and checks what holds for every pod and
// Config: no error; the same answer twice; pod left as it was; a denial with a message and
// nothing else; an allowed patch that the API server's patcher applies, after which Mutate has
// nothing more to do; a patch and allocations bounded by n. It returns the answer and the pod
// patched (pod itself when there is no patch).
func checkMutate(t *testing.T, pod *corev1.Pod, cfg webhook.Config, n int) (webhook.Result, *corev1.Pod) {
	t.Helper()
	before := pod.DeepCopy()
	res, err := webhook.Mutate(pod, cfg)
	if err != nil {
		t.Fatalf("Mutate: %v", err)
	}
	if diff := cmp.Diff(before, pod); diff != "" {
		t.Fatalf("Mutate changed its pod (-before +after):\n%s", diff)
	}
	if again, _ := webhook.Mutate(pod, cfg); !cmp.Equal(res, again) {
		t.Fatalf("Mutate twice on one pod: %s", cmp.Diff(res, again))
	}
	fuzzcost.Check(t, "Mutate", n, mutateAllocsBase, mutateAllocsPer, func() { _, _ = webhook.Mutate(pod, cfg) })
	if !res.Allowed {
		if res.Message == "" || res.Patch != nil || res.Template != nil || res.Skipped {
			t.Fatalf("denial %+v: want a message, no patch, no template", res)
		}
		return res, pod
	}
	if res.Message != "" || (res.Skipped && (res.Patch != nil || res.Template != nil)) {
		t.Fatalf("allowed %+v: want no message, and nothing with Skipped", res)
	}
	if len(res.Patch) == 0 {
		return res, pod
	}
	raw, err := json.Marshal(res.Patch)
	if err != nil {
		t.Fatal(err)
	}
	if limit := patchBytesPerByte*n + patchBytesBase; len(raw) > limit {
		t.Fatalf("a %d-byte pod got a %d-byte patch, want at most %d", n, len(raw), limit)
	}
	patched := applyWithAPIServerPatcher(t, pod, res.Patch)
	again, err := webhook.Mutate(patched, cfg)
	if err != nil || !again.Allowed || len(again.Patch) != 0 || again.Template != nil {
		t.Fatalf("Mutate on the patched pod: %+v, %v; want allowed with nothing more to do (patch %s)", again, err, raw)
	}
	return res, patched
}

// hamiPods seeds the conversion fuzzers: pods written for HAMi, for gpuslice, both at once,
// conflicting, and pods no webhook converts.
var hamiPods = []string{
	`{"metadata":{"name":"p","annotations":{"nvidia.com/use-gputype":"A100,H100","nvidia.com/nouse-gputype":"MIG","nvidia.com/use-gpuuuid":"GPU-a,GPU-b","nvidia.com/nouse-gpuuuid":"GPU-c","nvidia.com/numa-bind":"true","hami.io/gpu-scheduler-policy":"spread","hami.io/node-scheduler-policy":"binpack","example.com/other":"kept"}},` +
		`"spec":{"schedulerName":"default-scheduler","containers":[{"name":"train","resources":{"limits":{"nvidia.com/gpu":"2","nvidia.com/gpumem":"3000","nvidia.com/gpucores":"30"},"requests":{"nvidia.com/gpu":"2","nvidia.com/gpumem":"3000","nvidia.com/gpucores":"30"}}},` +
		`{"name":"eval","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem-percentage":"50"}}},{"name":"web","resources":{"limits":{"cpu":"1"}}}]}}`,
	`{"metadata":{"name":"p","annotations":{"nvidia.com/use-gputype":"A100","hami.io/gpu-model":"A100"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","hami.io/gpu":"1","nvidia.com/gpumem":"1Gi","hami.io/gpumem":"1024"}}}]}}`,
	`{"metadata":{"name":"p","annotations":{"nvidia.com/use-gputype":"A100","hami.io/gpu-model":"T4"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","hami.io/gpu":"2"}}}]}}`,
	`{"metadata":{"name":"p","annotations":{"hami.io/gpu-scheduler-policy":"topology-aware"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpumem":"10Gi"}}}]}}`,
	`{"metadata":{"name":"p","annotations":{"nvidia.com/use-gputype":"A100"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":"1"}}}]}}`,
	`{"spec":{"initContainers":[{"name":"side","restartPolicy":"Always","resources":{"limits":{"nvidia.com/gpumem":"512"}}}],"containers":[{"name":"main","resources":{"requests":{"nvidia.com/gpucores":"20"}}}]}}`,
	`{"metadata":{"name":"p","annotations":{"nvidia.com/use-gputype":"a/b~c"}},"spec":{"containers":[{"name":"c/~","resources":{"limits":{"nvidia.com/gpu":"1e1","nvidia.com/gpumem":"-1"}}}]}}`,
	`{"metadata":{"name":"p"},"spec":{"nodeName":"n","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
}

// FuzzMutateHAMi fuzzes the HAMi-compatible conversion (Config.HAMiCompat). Beyond checkMutate:
// the patched GPU pod carries no HAMi name, and it is the pod the plain webhook makes of the pod
// renamed by hand (rewriting is renaming, then the usual rules).
func FuzzMutateHAMi(f *testing.F) {
	for _, p := range append(hamiPods, fuzzPods...) {
		f.Add(p)
	}
	cfg := hamiConfig()
	f.Fuzz(func(t *testing.T, s string) {
		pod, ok := decodeFuzzPod(s, "default")
		if !ok {
			return
		}
		res, patched := checkMutate(t, pod, cfg, len(s))
		if !res.Allowed || res.Skipped {
			return
		}
		for _, r := range webhook.HAMiAnnotations() {
			if _, ok := patched.Annotations[r.HAMi]; ok {
				t.Fatalf("patched pod keeps annotation %s: %+v", r.HAMi, patched.Annotations)
			}
		}
		for _, c := range append(append([]corev1.Container{}, patched.Spec.InitContainers...), patched.Spec.Containers...) {
			for _, r := range webhook.HAMiResources() {
				_, inLimits := c.Resources.Limits[corev1.ResourceName(r.HAMi)]
				_, inRequests := c.Resources.Requests[corev1.ResourceName(r.HAMi)]
				if inLimits || inRequests {
					t.Fatalf("patched container %q keeps resource %s: %+v", c.Name, r.HAMi, c.Resources)
				}
			}
		}
		renamed := renameByHand(pod)
		plain, err := webhook.Mutate(renamed, webhook.DefaultConfig())
		if err != nil || !plain.Allowed {
			t.Fatalf("the pod renamed by hand: %+v, %v; the HAMi-compatible webhook allowed it", plain, err)
		}
		want := applyWithAPIServerPatcher(t, renamed, plain.Patch)
		if diff := cmp.Diff(want, applyWithAPIServerPatcher(t, patched, nil)); diff != "" {
			t.Fatalf("HAMi-compatible patch vs the plain webhook's on the pod renamed by hand (-plain +hami):\n%s", diff)
		}
	})
}

// renameByHand returns pod with HAMi's annotations and resources under gpuslice's names, as a
// user moving off HAMi writes it: a HAMi name whose gpuslice name is set already is dropped (the
// caller renames only pods the webhook allowed, in which both then hold the same value).
func renameByHand(pod *corev1.Pod) *corev1.Pod {
	out := pod.DeepCopy()
	for _, r := range webhook.HAMiAnnotations() {
		v, ok := out.Annotations[r.HAMi]
		if !ok {
			continue
		}
		if _, set := out.Annotations[r.Gpuslice]; !set {
			out.Annotations[r.Gpuslice] = v
		}
		delete(out.Annotations, r.HAMi)
	}
	for _, list := range [][]corev1.Container{out.Spec.InitContainers, out.Spec.Containers} {
		for i := range list {
			for _, l := range []corev1.ResourceList{list[i].Resources.Limits, list[i].Resources.Requests} {
				for _, r := range webhook.HAMiResources() {
					q, ok := l[corev1.ResourceName(r.HAMi)]
					if !ok {
						continue
					}
					if _, set := l[corev1.ResourceName(r.Gpuslice)]; !set {
						l[corev1.ResourceName(r.Gpuslice)] = q
					}
					delete(l, corev1.ResourceName(r.HAMi))
				}
			}
		}
	}
	return out
}

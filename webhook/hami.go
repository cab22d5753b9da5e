package webhook

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Rename is one HAMi name and the gpuslice name the webhook rewrites it to
// when Config.HAMiCompat is on.
type Rename struct {
	// HAMi is the name as HAMi's users write it.
	HAMi string
	// Gpuslice is the name it becomes.
	Gpuslice string
}

// HAMiResources returns the rewritten resource names: HAMi's defaults
// (its chart's resourceName, resourceMem, resourceCores and
// resourceMemPercentage) in container limits and requests. Each call
// returns a new slice.
func HAMiResources() []Rename {
	return []Rename{
		{"nvidia.com/gpu", string(vgpu.ResourceGPU)},
		{"nvidia.com/gpumem", string(vgpu.ResourceMemory)},
		{"nvidia.com/gpumem-percentage", string(vgpu.ResourceMemoryPercentage)},
		{"nvidia.com/gpucores", string(vgpu.ResourceCores)},
	}
}

// HAMiAnnotations returns the rewritten pod annotations: HAMi's GPU type
// and UUID filters, NUMA binding and scheduling policies. The values keep
// their meaning (comma-separated, case-insensitive substrings of the GPU
// model; comma-separated UUIDs; "true"/"false"; binpack/spread). Each call
// returns a new slice.
func HAMiAnnotations() []Rename {
	return []Rename{
		{"nvidia.com/use-gputype", vgpu.AnnotationGPUModel},
		{"nvidia.com/nouse-gputype", vgpu.AnnotationGPUModelExclude},
		{"nvidia.com/use-gpuuuid", vgpu.AnnotationGPUUUID},
		{"nvidia.com/nouse-gpuuuid", vgpu.AnnotationGPUUUIDExclude},
		{"nvidia.com/numa-bind", vgpu.AnnotationNUMABind},
		{"hami.io/gpu-scheduler-policy", vgpu.AnnotationGPUPolicy},
		{"hami.io/node-scheduler-policy", vgpu.AnnotationNodePolicy},
	}
}

// hamiPolicies are the policy values HAMi and gpuslice share.
var hamiPolicies = map[string]bool{string(vgpu.PolicyBinpack): true, string(vgpu.PolicySpread): true}

// rewriteHAMi renames, in pod, HAMi's annotations and resource names to
// gpuslice's, and returns the ops that do the same to the JSON pod, in a
// fixed order (annotations in HAMiAnnotations order, then init containers
// and app containers in spec order, limits before requests, resources in
// HAMiResources order), and every problem: a HAMi name set beside its
// gpuslice name with another value, or a policy gpuslice does not have. A
// HAMi name set beside its gpuslice name with the same value is removed.
func rewriteHAMi(pod *corev1.Pod) ([]JSONPatchOp, []error) {
	var ops []JSONPatchOp
	var problems []error
	for _, r := range HAMiAnnotations() {
		v, ok := pod.Annotations[r.HAMi]
		if !ok {
			continue
		}
		if r.Gpuslice == vgpu.AnnotationGPUPolicy || r.Gpuslice == vgpu.AnnotationNodePolicy {
			if !hamiPolicies[v] {
				problems = append(problems, fmt.Errorf("annotation %s=%q: must be binpack or spread (it becomes %s, whose values are %s)", r.HAMi, shorten(v), r.Gpuslice, vgpu.PolicyList()))
				continue
			}
		}
		from := pointer("metadata", "annotations", r.HAMi)
		if have, set := pod.Annotations[r.Gpuslice]; set {
			if have != v {
				problems = append(problems, fmt.Errorf("annotation %s=%q: conflicts with %s=%q, which it would become; set one of them", r.HAMi, shorten(v), r.Gpuslice, shorten(have)))
				continue
			}
			ops = append(ops, JSONPatchOp{Op: "remove", Path: from})
		} else {
			ops = append(ops, JSONPatchOp{Op: "move", From: from, Path: pointer("metadata", "annotations", r.Gpuslice)})
			pod.Annotations[r.Gpuslice] = v
		}
		delete(pod.Annotations, r.HAMi)
	}
	for _, list := range []struct {
		field      string
		containers []corev1.Container
	}{{"initContainers", pod.Spec.InitContainers}, {"containers", pod.Spec.Containers}} {
		for i := range list.containers {
			c := &list.containers[i]
			for _, l := range []struct {
				name string
				list corev1.ResourceList
			}{{"limits", c.Resources.Limits}, {"requests", c.Resources.Requests}} {
				o, p := renameResources(l.list, list.field, i, c.Name, l.name)
				ops, problems = append(ops, o...), append(problems, p...)
			}
		}
	}
	return ops, problems
}

// renameResources renames HAMi's resources in list, the lname ("limits"
// or "requests") of container name at spec.<field>[index].
func renameResources(list corev1.ResourceList, field string, index int, name, lname string) ([]JSONPatchOp, []error) {
	var ops []JSONPatchOp
	var problems []error
	at := func(resource string) string {
		return pointer("spec", field, strconv.Itoa(index), "resources", lname, resource)
	}
	for _, r := range HAMiResources() {
		from, to := corev1.ResourceName(r.HAMi), corev1.ResourceName(r.Gpuslice)
		q, ok := list[from]
		if !ok {
			continue
		}
		if have, set := list[to]; set {
			if have.Cmp(q) != 0 {
				problems = append(problems, fmt.Errorf("container %q: %s %s=%s: conflicts with %s=%s, which it would become; set one of them", name, lname, from, plain(q), to, plain(have)))
				continue
			}
			ops = append(ops, JSONPatchOp{Op: "remove", Path: at(r.HAMi)})
		} else {
			ops = append(ops, JSONPatchOp{Op: "move", From: at(r.HAMi), Path: at(r.Gpuslice)})
			list[to] = q
		}
		delete(list, from)
	}
	return ops, problems
}

// plain shows a whole quantity as a plain number ("1000", where String
// says "1k"), any other as String does.
func plain(q resource.Quantity) string {
	if v, ok := q.AsInt64(); ok {
		return strconv.FormatInt(v, 10)
	}
	return q.String()
}

package webhook

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuslice/gpuslice/vgpu"
)

// resourcePrefix marks the resources that make a pod a GPU pod.
const resourcePrefix = "hami.io/"

// maxShownProblems bounds the problems a denial lists; the rest are
// counted. A pod of thousands of invalid containers gets a message of a
// few kilobytes, not one line per container.
const maxShownProblems = 16

// Result is Mutate's decision on one pod.
type Result struct {
	// Patch is the RFC 6902 patch to send back, in a fixed order: HAMi's
	// names renamed (Config.HAMiCompat), the scheduler name, then init containers and app containers in spec
	// order, limits before requests. Nil when the pod needs no change or is
	// denied. Applying it and calling Mutate again yields a nil Patch.
	Patch []JSONPatchOp
	// Allowed is false when the pod must be rejected; Message says why.
	Allowed bool
	// Message, set only when Allowed is false, lists every problem, joined
	// with "; ", each naming the container, resource, value and rule, or
	// the annotation, value and rule.
	Message string
	// Skipped is true when Mutate left the pod alone because it is not a
	// GPU pod or its namespace is excluded; Allowed is then true.
	Skipped bool
	// Template, set when the pod is turned into a resource claim
	// (Config.DRA), is the ResourceClaimTemplate the patched pod names; it
	// must exist before the pod is admitted (Templates.Ensure).
	Template *resourcev1.ResourceClaimTemplate
}

// Mutate decides what the webhook does with pod at creation. pod.Namespace
// must be set (an admission handler copies the request's namespace when the
// object lacks it). Rules, in order:
//   - a pod in cfg.ExcludedNamespaces is allowed and skipped;
//   - with cfg.HAMiCompat, HAMi's annotations and resource names are
//     rewritten to gpuslice's first (rewriteHAMi: "move" ops, first in the
//     patch) and the rules below apply to the rewritten pod; for a GPU
//     pod, a conflict between a HAMi name and its gpuslice name, or a
//     HAMi policy gpuslice lacks, is a denial;
//   - a pod that carries vgpu.AnnotationPodAllocation is denied, GPU pod or
//     not: only the scheduler extender writes it, at bind;
//   - a pod with no hami.io/* resource in any container or init container
//     is allowed and skipped;
//   - a GPU pod is denied when spec.nodeName is set (it would bypass the
//     scheduler, so no allocation would ever be written for it), for
//     invalid placement annotations
//     (vgpu.ConstraintsFromPod, which also refuses values over vgpu's limits:
//     vgpu.MaxPlacementValueLength, vgpu.MaxListItems,
//     vgpu.MaxListItemLength), hami.io/* resources that vgpu does not know,
//     GPU resources in a regular (non-restartable) init container, and any
//     error of vgpu.RequestFromPod on the pod with the defaults below
//     applied (more than vgpu.MaxGPUContainersPerPod GPU containers
//     included);
//   - a valid GPU pod that cfg.DRA wants (it selects vgpu.LabelNodeMode=dra
//     in spec.nodeSelector, or its namespace is in cfg.DRA.Namespaces and
//     it selects no other mode) is allowed with a patch that adds the pod
//     claim DRAClaimName, made from Result.Template (one request per GPU
//     container, named after it: count = hami.io/gpu, capacity memory and
//     cores from hami.io/gpumem and hami.io/gpucores, model and UUID
//     annotations as CEL selectors), removes every hami.io/* resource and
//     gives each GPU container the claim's request of its name; with
//     cfg.DRA.Score it sets spec.schedulerName as below (that profile's
//     extender scores the nodes; kube-scheduler's allocator places the
//     claims), else it leaves it alone.
//     hami.io/gpumem-percentage other than 100, the enforcement
//     annotation and a pod claim already named DRAClaimName are denied;
//   - a pod that asks for no hami.io resource but has resource claims
//     (spec.resourceClaims) is, with cfg.DRA.SteerClaims, allowed with a
//     patch that sets spec.schedulerName as below; without, it is skipped;
//   - else it is allowed with a patch that sets spec.schedulerName to
//     cfg.SchedulerName when it is empty or corev1.DefaultSchedulerName, adds
//     vgpu.ResourceGPU "1" to limits (and to requests, when they hold a
//     vgpu resource) of containers that ask only for memory or cores, and
//     rewrites vgpu.ResourceMemory written with a binary suffix ("10Gi") as
//     a plain number of MiB ("10240") in limits and requests.
//
// A denial's message lists the problems in that order, at most
// maxShownProblems of them, and quotes at most vgpu.MaxShownValueRunes runes
// of any value.
//
// The returned error is not a denial: it means Mutate cannot decide (a nil
// pod or a cfg that fails Validate). Mutate does not modify pod; it is pure,
// deterministic and safe to call concurrently.
func Mutate(pod *corev1.Pod, cfg Config) (Result, error) {
	if pod == nil {
		return Result{}, errors.New("webhook: Mutate: nil pod")
	}
	if err := cfg.Validate(); err != nil {
		return Result{}, fmt.Errorf("webhook: Mutate: %w", err)
	}
	return mutate(pod, cfg), nil
}

// mutate is Mutate for a non-nil pod and a cfg that passed Validate, as the
// handler has them (it validated cfg once, when it was made).
func mutate(pod *corev1.Pod, cfg Config) Result {
	if cfg.excluded(pod.Namespace) {
		return Result{Allowed: true, Skipped: true}
	}
	var problems, renameProblems []error
	var renames []JSONPatchOp
	if cfg.HAMiCompat {
		pod = pod.DeepCopy()
		renames, renameProblems = rewriteHAMi(pod)
	}
	if v, ok := pod.Annotations[vgpu.AnnotationPodAllocation]; ok {
		problems = append(problems, fmt.Errorf("annotation %s=%q: must not be set when the pod is created: only the gpuslice scheduler extender writes it, when it binds the pod",
			vgpu.AnnotationPodAllocation, shorten(v)))
	}
	if !vgpu.AsksForGPU(pod) {
		if len(problems) > 0 {
			return deny(problems)
		}
		if cfg.DRA.SteerClaims && len(pod.Spec.ResourceClaims) > 0 {
			if ops := schedulerName(pod.DeepCopy(), cfg); len(ops) > 0 {
				return Result{Patch: ops, Allowed: true}
			}
		}
		return Result{Allowed: true, Skipped: true}
	}
	problems = append(problems, renameProblems...)
	if pod.Spec.NodeName != "" {
		problems = append(problems, fmt.Errorf("spec.nodeName=%q: must be empty for a pod that asks for hami.io resources: only the gpuslice scheduler gives a pod its GPU slice, "+
			"when it binds it; to pick the node, use a nodeSelector on kubernetes.io/hostname or node affinity", shorten(pod.Spec.NodeName)))
	}
	if _, err := vgpu.ConstraintsFromPod(pod); err != nil {
		problems = append(problems, flatten(err)...)
	}
	problems = append(problems, unknownResources(pod)...)
	problems = append(problems, regularInitContainers(pod)...)

	defaulted := pod.DeepCopy()
	ops := append(renames, schedulerName(defaulted, cfg)...)
	for i := range defaulted.Spec.InitContainers {
		ops = append(ops, containerDefaults(&defaulted.Spec.InitContainers[i], "initContainers", i)...)
	}
	for i := range defaulted.Spec.Containers {
		ops = append(ops, containerDefaults(&defaulted.Spec.Containers[i], "containers", i)...)
	}
	req, err := vgpu.RequestFromPod(defaulted)
	if err != nil {
		problems = append(problems, flatten(err)...)
	}
	if len(problems) > 0 {
		return deny(problems)
	}
	if cfg.DRA.wants(pod) {
		cons, _ := vgpu.ConstraintsFromPod(pod) // checked above
		tmpl, draOps, errs := draConvert(pod, req, cons, cfg.DRA)
		if len(errs) > 0 {
			return deny(errs)
		}
		patch := renames
		if cfg.DRA.Score {
			patch = append(patch, schedulerName(pod.DeepCopy(), cfg)...)
		}
		return Result{Patch: append(patch, draOps...), Allowed: true, Template: tmpl}
	}
	return Result{Patch: ops, Allowed: true}
}

// deny returns the denial that lists problems in order, at most
// maxShownProblems of them, then how many more there are.
func deny(problems []error) Result {
	shown := problems[:min(len(problems), maxShownProblems)]
	msgs := make([]string, 0, len(shown)+1)
	for _, p := range shown {
		msgs = append(msgs, p.Error())
	}
	if more := len(problems) - len(shown); more > 0 {
		msgs = append(msgs, fmt.Sprintf("and %d more problems", more))
	}
	return Result{Message: strings.Join(msgs, "; ")}
}

// flatten returns the errors joined in err (errors.Join), or err alone.
func flatten(err error) []error {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		return joined.Unwrap()
	}
	return []error{err}
}

// shorten is what a denial quotes of a value the pod's author wrote
// (vgpu.Abbreviate).
func shorten(s string) string { return vgpu.Abbreviate(s) }

// unknownResourceRule is the rule unknownResources reports.
var unknownResourceRule = func() string {
	names := make([]string, 0, len(vgpu.Resources()))
	for _, r := range vgpu.Resources() {
		names = append(names, string(r))
	}
	return "unknown gpuslice resource: must be one of " + strings.Join(names, ", ")
}()

// unknownResources returns one *vgpu.RequestError per container and
// hami.io/* resource name that vgpu.Resources does not list (a typo such as
// hami.io/gpumemory would otherwise leave the pod Pending for ever), in
// container order then name order.
func unknownResources(pod *corev1.Pod) []error {
	known := vgpu.Resources()
	var errs []error
	check := func(c corev1.Container, init bool) {
		seen := map[corev1.ResourceName]resource.Quantity{}
		for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for name, q := range list {
				if strings.HasPrefix(string(name), resourcePrefix) && !slices.Contains(known, name) {
					seen[name] = q // limits win, as they are read last
				}
			}
		}
		for _, name := range slices.Sorted(maps.Keys(seen)) {
			q := seen[name]
			errs = append(errs, &vgpu.RequestError{Container: c.Name, Init: init, Resource: string(name), Value: q.String(), Allowed: unknownResourceRule})
		}
	}
	for _, c := range pod.Spec.InitContainers {
		check(c, true)
	}
	for _, c := range pod.Spec.Containers {
		check(c, false)
	}
	return errs
}

// regularInitContainers returns one *vgpu.RequestError per regular
// (non-restartable) init container that sets a vgpu resource, naming the
// first one it sets (limits before requests, vgpu.Resources order). The
// kubelet's PodResources API skips such containers, so the device plugin
// cannot find their owner to hand them their slice exactly.
func regularInitContainers(pod *corev1.Pod) []error {
	var errs []error
	for _, c := range pod.Spec.InitContainers {
		if vgpu.IsSidecar(&c) {
			continue
		}
		name, q, ok := firstResource(c.Resources)
		if !ok {
			continue
		}
		errs = append(errs, &vgpu.RequestError{
			Container: c.Name, Init: true, Resource: string(name), Value: q.String(),
			Allowed: "a regular init container cannot get a GPU slice, as gpuslice cannot hand it its own slice exactly; " +
				"make it a sidecar (an init container with restartPolicy: Always) or do the GPU work in an app container",
		})
	}
	return errs
}

// firstResource returns the first vgpu resource res sets, limits first.
func firstResource(res corev1.ResourceRequirements) (corev1.ResourceName, resource.Quantity, bool) {
	for _, list := range []corev1.ResourceList{res.Limits, res.Requests} {
		for _, name := range vgpu.Resources() {
			if q, ok := list[name]; ok {
				return name, q, true
			}
		}
	}
	return "", resource.Quantity{}, false
}

// schedulerName steers pod to cfg.SchedulerName unless it names another
// non-default scheduler, updating pod to match the ops it returns.
func schedulerName(pod *corev1.Pod, cfg Config) []JSONPatchOp {
	path := pointer("spec", "schedulerName")
	var op JSONPatchOp
	switch pod.Spec.SchedulerName {
	case "":
		op = JSONPatchOp{Op: "add", Path: path, Value: cfg.SchedulerName}
	case corev1.DefaultSchedulerName:
		op = JSONPatchOp{Op: "replace", Path: path, Value: cfg.SchedulerName}
	default:
		return nil
	}
	pod.Spec.SchedulerName = cfg.SchedulerName
	return []JSONPatchOp{op}
}

// containerDefaults applies the defaults to c, the index-th entry of
// spec.<field>, and returns the ops that do the same to the JSON pod:
// limits first (vgpu.ResourceGPU added, then vgpu.ResourceMemory
// converted), then requests.
func containerDefaults(c *corev1.Container, field string, index int) []JSONPatchOp {
	res := &c.Resources
	_, gpuInLimits := res.Limits[vgpu.ResourceGPU]
	_, gpuInRequests := res.Requests[vgpu.ResourceGPU]
	addGPU := !gpuInLimits && !gpuInRequests && asksForSlice(res.Limits, res.Requests)
	requestsHold := hasAny(res.Requests, vgpu.Resources())
	base := []string{"spec", field, strconv.Itoa(index), "resources"}
	var ops []JSONPatchOp
	for _, l := range []struct {
		name string
		list *corev1.ResourceList
		add  bool
	}{{"limits", &res.Limits, addGPU}, {"requests", &res.Requests, addGPU && requestsHold}} {
		at := func(tokens ...string) string { return pointer(slices.Concat(base, []string{l.name}, tokens)...) }
		if l.add {
			if *l.list == nil {
				*l.list = corev1.ResourceList{}
				ops = append(ops, JSONPatchOp{Op: "add", Path: at(), Value: map[string]string{string(vgpu.ResourceGPU): "1"}})
			} else {
				ops = append(ops, JSONPatchOp{Op: "add", Path: at(string(vgpu.ResourceGPU)), Value: "1"})
			}
			(*l.list)[vgpu.ResourceGPU] = *resource.NewQuantity(1, resource.DecimalSI)
		}
		if q, ok := (*l.list)[vgpu.ResourceMemory]; ok {
			if mib, ok := unitMemoryMiB(q); ok {
				(*l.list)[vgpu.ResourceMemory] = *resource.NewQuantity(mib, resource.DecimalSI)
				ops = append(ops, JSONPatchOp{Op: "replace", Path: at(string(vgpu.ResourceMemory)), Value: strconv.FormatInt(mib, 10)})
			}
		}
	}
	return ops
}

// asksForSlice reports whether any list sets a vgpu resource other than
// vgpu.ResourceGPU.
func asksForSlice(lists ...corev1.ResourceList) bool {
	for _, l := range lists {
		if hasAny(l, []corev1.ResourceName{vgpu.ResourceMemory, vgpu.ResourceMemoryPercentage, vgpu.ResourceCores}) {
			return true
		}
	}
	return false
}

func hasAny(list corev1.ResourceList, names []corev1.ResourceName) bool {
	for _, n := range names {
		if _, ok := list[n]; ok {
			return true
		}
	}
	return false
}

// unitMemoryMiB returns q in MiB when q is written with a binary suffix and
// is a whole number of MiB from 1 to vgpu.MaxMemoryMiB. Anything else stays
// as written, for vgpu.RequestFromPod to accept (a plain number is already
// MiB) or reject with the user's own value in the message.
func unitMemoryMiB(q resource.Quantity) (int64, bool) {
	if q.Format != resource.BinarySI || q.Sign() <= 0 {
		return 0, false
	}
	if q.Cmp(*resource.NewQuantity(vgpu.MaxMemoryMiB<<20, resource.BinarySI)) > 0 {
		return 0, false
	}
	bytes := q.Value()
	if q.Cmp(*resource.NewQuantity(bytes, resource.BinarySI)) != 0 || bytes%(1<<20) != 0 {
		return 0, false
	}
	return bytes >> 20, true
}

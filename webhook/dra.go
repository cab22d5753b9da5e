package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuslice/gpuslice/vgpu"
)

// DRA conversion: a pod written with hami.io/* resources, bound for a DRA-mode node pool, gets
// one pod-level claim (DRAClaimName) made from a ResourceClaimTemplate with one request per GPU
// container; its hami.io/* resources are removed. The template's name is a hash of its spec, so
// pods that ask for the same slices share one template per namespace (the resourceclaim
// controller still makes one claim per pod) and creating it again is a no-op.
const (
	// DRAClaimName is the name of the pod claim the webhook adds.
	DRAClaimName = "gpuslice"
	// DRATemplatePrefix starts the names of the templates the webhook makes.
	DRATemplatePrefix = "gpuslice-"
	// DefaultDRADeviceClass is the default DRAConfig.DeviceClassName, the class the chart installs.
	DefaultDRADeviceClass = "gpuslice.hami.io"
	// draAttributeDomain qualifies the attributes the driver publishes (its driver name).
	draAttributeDomain = "gpuslice.hami.io"
	// LabelDRATemplate marks the templates the webhook makes, value "true".
	LabelDRATemplate = "gpuslice.hami.io/webhook-template"
)

// DRAConfig says which GPU pods become resource claims and how.
type DRAConfig struct {
	// Enabled turns the conversion on. Off, pods are never converted, even
	// those that select vgpu.LabelNodeMode=dra.
	Enabled bool `json:"enabled,omitempty"`
	// Namespaces are namespaces whose GPU pods are converted unless they
	// select another vgpu.LabelNodeMode value; "*" alone means every
	// namespace. Empty: only pods whose spec.nodeSelector has
	// vgpu.LabelNodeMode=dra are.
	Namespaces []string `json:"namespaces,omitempty"`
	// DeviceClassName is the DeviceClass the requests name; empty means
	// DefaultDRADeviceClass.
	DeviceClassName string `json:"deviceClassName,omitempty"`
	// Score steers converted pods to Config.SchedulerName, whose extender
	// ranks DRA pods' nodes by gpuslice's score (the extender's dra,
	// docs/dra.md), as it steers device-plugin pods. Off, the scheduler
	// name is left alone and the stock profile places them.
	Score bool `json:"score,omitempty"`
	// SteerClaims, with Score, also steers pods that ask for no hami.io
	// resource but have resource claims of their own (spec.resourceClaims)
	// to Config.SchedulerName, so that native claims of gpuslice's
	// DeviceClasses get the same node scoring. The webhook cannot tell a
	// claim's DeviceClass without reading its template, so every pod with
	// a claim goes there; the extender scores pods without a gpuslice
	// claim neutrally and the profile's own DRA allocator places any
	// claim, but those pods then wait for the gpuslice profile's
	// kube-scheduler. Off by default.
	SteerClaims bool `json:"steerClaims,omitempty"`
}

// deviceClass returns the class the requests name.
func (c DRAConfig) deviceClass() string {
	if c.DeviceClassName == "" {
		return DefaultDRADeviceClass
	}
	return c.DeviceClassName
}

// wants reports whether pod, in namespace ns, is converted.
func (c DRAConfig) wants(pod *corev1.Pod) bool {
	if !c.Enabled {
		return false
	}
	if mode, ok := pod.Spec.NodeSelector[vgpu.LabelNodeMode]; ok {
		return mode == vgpu.NodeModeDRA
	}
	return slices.Contains(c.Namespaces, "*") || slices.Contains(c.Namespaces, pod.Namespace)
}

// draRequest turns one container's request into a device request; the
// request is named after the container (a DNS label, as request names must be).
func draRequest(c vgpu.ContainerRequest, class string, selectors []resourcev1.DeviceSelector) (resourcev1.DeviceRequest, []error) {
	var errs []error
	if len(validation.IsDNS1123Label(c.Name)) > 0 {
		errs = append(errs, fmt.Errorf("container %q: on DRA-mode nodes the name is that of its request in the pod's claim, so it must be a DNS label "+
			"(at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit)", c.Name))
	}
	kind := "containers"
	if c.Init {
		kind = "initContainers"
	}
	req := map[resourcev1.QualifiedName]resource.Quantity{}
	switch {
	case c.Exclusive:
		// The whole GPU: all its memory (the request policy's default) and all its cores.
		req["cores"] = *resource.NewQuantity(100, resource.DecimalSI)
	case c.MemoryMiB > 0:
		req["memory"] = *resource.NewQuantity(c.MemoryMiB<<20, resource.BinarySI)
	case c.MemoryPercent != 0 && c.MemoryPercent != 100:
		errs = append(errs, &vgpu.RequestError{Container: c.Name, Init: c.Init, Resource: string(vgpu.ResourceMemoryPercentage), Value: strconv.Itoa(c.MemoryPercent),
			Allowed: "is not served on DRA-mode nodes, whose claims ask for memory in bytes: use " + string(vgpu.ResourceMemory) + " (MiB) in " + kind + " " + c.Name})
	}
	if c.CoresPercent > 0 && !c.Exclusive {
		req["cores"] = *resource.NewQuantity(int64(c.CoresPercent), resource.DecimalSI)
	}
	exact := &resourcev1.ExactDeviceRequest{
		DeviceClassName: class,
		AllocationMode:  resourcev1.DeviceAllocationModeExactCount,
		Count:           int64(c.GPUs),
		Selectors:       make([]resourcev1.DeviceSelector, 0, len(selectors)),
	}
	for _, sel := range selectors {
		exact.Selectors = append(exact.Selectors, *sel.DeepCopy())
	}
	if len(req) > 0 {
		exact.Capacity = &resourcev1.CapacityRequirements{Requests: req}
	}
	return resourcev1.DeviceRequest{Name: c.Name, Exactly: exact}, errs
}

// draSelectors turns the model and UUID annotations into CEL selectors
// with vgpu's meaning: a model matches when it contains one of the
// substrings, compared case-insensitively. An annotation whose selector is
// longer than the API server takes (CELSelectorExpressionMaxLength) is an
// error naming it. Within that length a selector's CEL cost stays far below
// CELSelectorExpressionMaxCost (about one unit per 1.4 bytes).
func draSelectors(c vgpu.Constraints) ([]resourcev1.DeviceSelector, []error) {
	attr := func(name string) string { return fmt.Sprintf("device.attributes[%q].%s", draAttributeDomain, name) }
	model := attr("model") + ".lowerAscii()"
	contains := func(models []string) string {
		parts := make([]string, 0, len(models))
		for _, m := range models {
			parts = append(parts, fmt.Sprintf("%s.contains(%q)", model, strings.ToLower(m)))
		}
		return strings.Join(parts, " || ")
	}
	quoted := func(list []string) string {
		b, _ := json.Marshal(list) // a JSON list of strings is a CEL list literal
		return string(b)
	}
	var out []resourcev1.DeviceSelector
	var errs []error
	for _, s := range []struct {
		annotation string
		items      []string
		expr       func() string
	}{
		{vgpu.AnnotationGPUModel, c.Models, func() string { return contains(c.Models) }},
		{vgpu.AnnotationGPUModelExclude, c.ExcludeModels, func() string { return "!(" + contains(c.ExcludeModels) + ")" }},
		{vgpu.AnnotationGPUUUID, c.UUIDs, func() string { return attr("uuid") + " in " + quoted(c.UUIDs) }},
		{vgpu.AnnotationGPUUUIDExclude, c.ExcludeUUIDs, func() string { return "!(" + attr("uuid") + " in " + quoted(c.ExcludeUUIDs) + ")" }},
	} {
		if len(s.items) == 0 {
			continue
		}
		e := s.expr()
		if len(e) > resourcev1.CELSelectorExpressionMaxLength {
			errs = append(errs, fmt.Errorf("annotation %s: its %d entries make a CEL selector of %d bytes on DRA-mode nodes, where a selector has at most %d; list fewer",
				s.annotation, len(s.items), len(e), resourcev1.CELSelectorExpressionMaxLength))
			continue
		}
		out = append(out, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: e}})
	}
	return out, errs
}

// draConvert returns the template and the patch that turn pod (its
// defaults applied, requests valid) into a pod with a claim, or the
// problems that prevent it.
func draConvert(pod *corev1.Pod, req vgpu.PodRequest, cons vgpu.Constraints, cfg DRAConfig) (*resourcev1.ResourceClaimTemplate, []JSONPatchOp, []error) {
	var errs []error
	if cons.Enforcement != (vgpu.EnforcementRequirement{}) {
		errs = append(errs, fmt.Errorf("annotation %s: is not served on DRA-mode nodes (the DRA driver publishes no enforcement attribute yet); remove it, or select a device-plugin pool with nodeSelector %s", vgpu.AnnotationEnforcement, vgpu.LabelNodeMode))
	}
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.Name == DRAClaimName {
			errs = append(errs, fmt.Errorf("spec.resourceClaims[name=%q]: the name is the claim gpuslice adds for the pod's hami.io resources; rename the pod's own claim", DRAClaimName))
		}
	}
	if n := len(req.Containers); n > resourcev1.DeviceRequestsMaxSize {
		return nil, nil, append(errs, fmt.Errorf("the pod has %d GPU containers: on DRA-mode nodes each becomes a request of the pod's claim, which holds at most %d; "+
			"give fewer containers GPUs, or select a device-plugin pool with nodeSelector %s", n, resourcev1.DeviceRequestsMaxSize, vgpu.LabelNodeMode))
	}
	selectors, serrs := draSelectors(cons)
	errs = append(errs, serrs...)
	spec := resourcev1.ResourceClaimSpec{}
	gpus := 0
	for _, c := range req.Containers {
		r, rerrs := draRequest(c, cfg.deviceClass(), selectors)
		errs = append(errs, rerrs...)
		gpus += c.GPUs
		spec.Devices.Requests = append(spec.Devices.Requests, r)
		if cons.NUMABind && c.GPUs > 1 {
			spec.Devices.Constraints = append(spec.Devices.Constraints, resourcev1.DeviceConstraint{
				Requests: []string{c.Name}, MatchAttribute: ptrTo(resourcev1.FullyQualifiedName(draAttributeDomain + "/numaNode")),
			})
		}
	}
	if gpus > resourcev1.AllocationResultsMaxSize {
		errs = append(errs, fmt.Errorf("the pod's containers ask for %d GPUs (%s) in all: on DRA-mode nodes the pod's claim is allocated at most %d devices; "+
			"ask for fewer, or select a device-plugin pool with nodeSelector %s", gpus, vgpu.ResourceGPU, resourcev1.AllocationResultsMaxSize, vgpu.LabelNodeMode))
	}
	if len(errs) > 0 {
		return nil, nil, errs
	}
	raw, err := json.Marshal(spec)
	if err != nil { // Not expected: the spec is plain data.
		return nil, nil, []error{fmt.Errorf("encode the claim template: %w", err)}
	}
	sum := sha256.Sum256(raw)
	tmpl := &resourcev1.ResourceClaimTemplate{
		TypeMeta: metav1.TypeMeta{APIVersion: resourcev1.SchemeGroupVersion.String(), Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{
			Name: DRATemplatePrefix + hex.EncodeToString(sum[:8]), Namespace: pod.Namespace,
			Labels: map[string]string{LabelDRATemplate: "true"},
		},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: spec},
	}

	claim := corev1.PodResourceClaim{Name: DRAClaimName, ResourceClaimTemplateName: &tmpl.Name}
	var ops []JSONPatchOp
	if len(pod.Spec.ResourceClaims) == 0 {
		ops = append(ops, JSONPatchOp{Op: "add", Path: pointer("spec", "resourceClaims"), Value: []corev1.PodResourceClaim{claim}})
	} else {
		ops = append(ops, JSONPatchOp{Op: "add", Path: pointer("spec", "resourceClaims", "-"), Value: claim})
	}
	for i := range pod.Spec.InitContainers {
		ops = append(ops, draContainer(&pod.Spec.InitContainers[i], "initContainers", i)...)
	}
	for i := range pod.Spec.Containers {
		ops = append(ops, draContainer(&pod.Spec.Containers[i], "containers", i)...)
	}
	return tmpl, ops, nil
}

// draContainer returns the ops that remove c's vgpu resources (limits,
// then requests, in vgpu.Resources order) and give it the pod claim's
// request named after it; none for a container without vgpu resources.
func draContainer(c *corev1.Container, field string, index int) []JSONPatchOp {
	if !hasAny(c.Resources.Limits, vgpu.Resources()) && !hasAny(c.Resources.Requests, vgpu.Resources()) {
		return nil
	}
	base := []string{"spec", field, strconv.Itoa(index), "resources"}
	var ops []JSONPatchOp
	for _, l := range []struct {
		name string
		list corev1.ResourceList
	}{{"limits", c.Resources.Limits}, {"requests", c.Resources.Requests}} {
		for _, name := range vgpu.Resources() {
			if _, ok := l.list[name]; ok {
				ops = append(ops, JSONPatchOp{Op: "remove", Path: pointer(slices.Concat(base, []string{l.name, string(name)})...)})
			}
		}
	}
	ref := corev1.ResourceClaim{Name: DRAClaimName, Request: c.Name}
	if len(c.Resources.Claims) == 0 {
		ops = append(ops, JSONPatchOp{Op: "add", Path: pointer(slices.Concat(base, []string{"claims"})...), Value: []corev1.ResourceClaim{ref}})
	} else {
		ops = append(ops, JSONPatchOp{Op: "add", Path: pointer(slices.Concat(base, []string{"claims", "-"})...), Value: ref})
	}
	return ops
}

func ptrTo[T any](v T) *T { return &v }

// maxTemplateDiffs bounds the differences draTemplateDiff reports, and
// maxShownValue the bytes of each value it quotes, so that a denial stays
// short whatever a template holds.
const (
	maxTemplateDiffs = 4
	maxShownValue    = 80
)

// draTemplateDiff returns what makes have, the template stored under want's
// name, other than the one the webhook makes: a missing LabelDRATemplate
// label, a deletion under way, then each field of the spec that differs
// (its JSON path, the value found and the value wanted), at most
// maxTemplateDiffs in all; nil when have is want. Fields compare under
// Semantic equality, so the API server's defaults, empty lists and
// quantities written in other units are not differences.
func draTemplateDiff(have, want *resourcev1.ResourceClaimTemplate) []string {
	var out []string
	if v := have.Labels[LabelDRATemplate]; v != want.Labels[LabelDRATemplate] {
		out = append(out, fmt.Sprintf("metadata.labels[%s] is %s, want %s", LabelDRATemplate, showLabel(have.Labels, LabelDRATemplate), strconv.Quote(want.Labels[LabelDRATemplate])))
	}
	if have.DeletionTimestamp != nil {
		out = append(out, "metadata.deletionTimestamp is set: the template is being deleted")
	}
	fieldDiff("spec", reflect.ValueOf(have.Spec), reflect.ValueOf(want.Spec), &out)
	return out
}

func showLabel(labels map[string]string, key string) string {
	if v, ok := labels[key]; ok {
		return strconv.Quote(v)
	}
	return "absent"
}

var quantityType = reflect.TypeFor[resource.Quantity]()

// fieldDiff appends to out, up to maxTemplateDiffs, the paths below path at
// which have and want (values of one type, as the API serializes them)
// differ: it descends into structs by their JSON names, into lists by index
// (after their lengths) and into maps by key, and reports a difference at
// the deepest level it can name.
func fieldDiff(path string, have, want reflect.Value, out *[]string) {
	if len(*out) >= maxTemplateDiffs || equality.Semantic.DeepEqual(have.Interface(), want.Interface()) {
		return
	}
	before := len(*out)
	switch have.Kind() {
	case reflect.Pointer:
		if !have.IsNil() && !want.IsNil() {
			fieldDiff(path, have.Elem(), want.Elem(), out)
		}
	case reflect.Struct:
		if have.Type() == quantityType {
			break
		}
		for i := range have.NumField() {
			f := have.Type().Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case !f.IsExported() || name == "-":
				continue
			case name == "" && (f.Anonymous || opts == "inline"):
				fieldDiff(path, have.Field(i), want.Field(i), out)
			case name == "":
				fieldDiff(path+"."+f.Name, have.Field(i), want.Field(i), out)
			default:
				fieldDiff(path+"."+name, have.Field(i), want.Field(i), out)
			}
		}
	case reflect.Slice:
		if have.Len() != want.Len() {
			*out = append(*out, fmt.Sprintf("%s has %d entries, want %d", path, have.Len(), want.Len()))
		}
		for i := range min(have.Len(), want.Len()) {
			fieldDiff(fmt.Sprintf("%s[%d]", path, i), have.Index(i), want.Index(i), out)
		}
	case reflect.Map:
		keys := map[string]reflect.Value{}
		for _, m := range []reflect.Value{have, want} {
			for _, k := range m.MapKeys() {
				keys[fmt.Sprint(k.Interface())] = k
			}
		}
		for _, name := range slices.Sorted(maps.Keys(keys)) {
			k, p := keys[name], path+"["+name+"]"
			h, w := have.MapIndex(k), want.MapIndex(k)
			switch {
			case !h.IsValid():
				*out = append(*out, fmt.Sprintf("%s is absent, want %s", p, showValue(w)))
			case !w.IsValid():
				*out = append(*out, fmt.Sprintf("%s is %s, want absent", p, showValue(h)))
			default:
				fieldDiff(p, h, w, out)
			}
			if len(*out) >= maxTemplateDiffs {
				break
			}
		}
	}
	if len(*out) == before && len(*out) < maxTemplateDiffs {
		*out = append(*out, fmt.Sprintf("%s is %s, want %s", path, showValue(have), showValue(want)))
	}
}

// showValue is v as JSON, cut to maxShownValue bytes.
func showValue(v reflect.Value) string {
	b, err := json.Marshal(v.Interface())
	if err != nil {
		return fmt.Sprintf("%v", v.Interface())
	}
	if len(b) > maxShownValue {
		// Cut at a rune's start: the JSON may quote a user's text.
		return strings.ToValidUTF8(string(b[:maxShownValue]), "") + "…"
	}
	return string(b)
}

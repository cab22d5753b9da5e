package vgpu

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Constraints are a pod's placement wishes, read from its annotations by
// ParseConstraints. The zero value means no constraint and the global
// policies.
type Constraints struct {
	// Models, when not empty, admits only GPUs whose model contains one of
	// these substrings, compared case-insensitively.
	Models []string
	// ExcludeModels rejects GPUs whose model contains any of these
	// substrings, compared case-insensitively.
	ExcludeModels []string
	// UUIDs, when not empty, admits only these GPUs.
	UUIDs []string
	// ExcludeUUIDs rejects these GPUs.
	ExcludeUUIDs []string
	// NUMABind asks that all GPUs of each container share one NUMA node.
	// GPUs whose NUMA node is unknown (-1) count as one NUMA node.
	NUMABind bool
	// NodePolicy overrides the global node policy; "" keeps it.
	NodePolicy Policy
	// GPUPolicy overrides the global GPU policy; "" keeps it.
	GPUPolicy Policy
	// Enforcement is what the pod asks of the node's enforcement
	// mechanism (AnnotationEnforcement).
	Enforcement EnforcementRequirement
}

// AnnotationError is one invalid placement annotation. ParseConstraints
// joins one per bad key; each wraps ErrMalformed.
type AnnotationError struct {
	// Key is the annotation key, e.g. "hami.io/gpu-policy".
	Key string
	// Value is the value as written; Error quotes at most
	// MaxShownValueRunes runes of it.
	Value string
	// Allowed says what would be accepted, e.g. "must be one of binpack,
	// spread, fragmentation", and for a value over a limit the limit and
	// what the value holds: "must list at most 32 models, not 40".
	Allowed string
}

// Error renders e as `hami.io/gpu-policy="pack": must be one of binpack,
// spread, fragmentation`. A value longer than MaxShownValueRunes is cut
// (Abbreviate) and followed by its length: `hami.io/gpu-model-exclude="40GB,
// 40GB,…" (204800 bytes): must be at most 4096 bytes`.
func (e *AnnotationError) Error() string {
	shown := Abbreviate(e.Value)
	if len(shown) < len(e.Value) {
		return fmt.Sprintf("%s=%q (%d bytes): %s", e.Key, shown, len(e.Value), e.Allowed)
	}
	return fmt.Sprintf("%s=%q: %s", e.Key, e.Value, e.Allowed)
}

// Unwrap returns ErrMalformed.
func (e *AnnotationError) Unwrap() error { return ErrMalformed }

// ConstraintsFromPod is ParseConstraints of pod's annotations. A nil pod has
// no constraints.
func ConstraintsFromPod(pod *corev1.Pod) (Constraints, error) {
	if pod == nil {
		return Constraints{}, nil
	}
	return ParseConstraints(pod.Annotations)
}

// ParseConstraints reads the placement annotations (AnnotationGPUModel …
// AnnotationGPUPolicy, AnnotationEnforcement) from annotations; other keys
// are ignored. Lists are comma-separated; blanks around items are trimmed and
// empty items dropped, so "A100, H100," is two models. Every value is at most
// MaxPlacementValueLength bytes, and a list at most MaxListItems items of at
// most MaxListItemLength bytes; a value over a limit is rejected before it is
// read further. On any invalid value it returns a zero Constraints and every
// problem at once (errors.Join of *AnnotationError, in key order). Its cost
// is linear in the bytes of the placement values, which the limits bound. It
// is pure and safe to call concurrently.
func ParseConstraints(annotations map[string]string) (Constraints, error) {
	var c Constraints
	var errs []error
	for _, k := range []struct {
		key, items string
		dst        *[]string
	}{
		{AnnotationGPUModel, "models", &c.Models}, {AnnotationGPUModelExclude, "models", &c.ExcludeModels},
		{AnnotationGPUUUID, "GPU UUIDs", &c.UUIDs}, {AnnotationGPUUUIDExclude, "GPU UUIDs", &c.ExcludeUUIDs},
	} {
		items, err := parseList(k.key, annotations[k.key], k.items)
		if err != nil {
			errs = append(errs, err)
		}
		*k.dst = items
	}
	if v := annotations[AnnotationNUMABind]; overLimit(v) {
		errs = append(errs, tooLong(AnnotationNUMABind, v, ""))
	} else {
		switch v {
		case "", "false":
		case "true":
			c.NUMABind = true
		default:
			errs = append(errs, &AnnotationError{Key: AnnotationNUMABind, Value: v, Allowed: `must be "true" or "false"`})
		}
	}
	for _, k := range []struct {
		key string
		dst *Policy
	}{{AnnotationNodePolicy, &c.NodePolicy}, {AnnotationGPUPolicy, &c.GPUPolicy}} {
		v := annotations[k.key]
		if overLimit(v) {
			errs = append(errs, tooLong(k.key, v, ""))
			continue
		}
		p, err := ParsePolicy(v)
		if err != nil {
			errs = append(errs, &AnnotationError{Key: k.key, Value: v, Allowed: "must be one of " + PolicyList()})
		}
		*k.dst = p
	}
	if v := annotations[AnnotationEnforcement]; overLimit(v) {
		errs = append(errs, tooLong(AnnotationEnforcement, v, ""))
	} else if v != "" {
		r, ok := parseEnforcementRequirement(v)
		if !ok {
			errs = append(errs, &AnnotationError{Key: AnnotationEnforcement, Value: v, Allowed: enforcementAllowed})
		}
		c.Enforcement = r
	}
	if len(errs) > 0 {
		return Constraints{}, errors.Join(errs...)
	}
	return c, nil
}

// overLimit reports whether a placement value breaks MaxPlacementValueLength.
func overLimit(v string) bool { return len(v) > MaxPlacementValueLength }

// tooLong is the error of a placement value over MaxPlacementValueLength;
// items, when set, names what a list holds.
func tooLong(key, v, items string) *AnnotationError {
	allowed := fmt.Sprintf("must be at most %d bytes", MaxPlacementValueLength)
	if items != "" {
		allowed += fmt.Sprintf(": at most %d %s of at most %d bytes each", MaxListItems, items, MaxListItemLength)
	}
	return &AnnotationError{Key: key, Value: v, Allowed: allowed}
}

// parseList reads one placement list of key, whose items are called items
// in messages, within the limits.
func parseList(key, v, items string) ([]string, error) {
	if overLimit(v) {
		return nil, tooLong(key, v, items)
	}
	var out []string
	n := 0 // items, those past MaxListItems counted only
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		switch {
		case item == "":
			continue
		case len(item) > MaxListItemLength:
			return nil, &AnnotationError{Key: key, Value: v, Allowed: fmt.Sprintf(
				"each of the %s must be at most %d bytes: item %d is %d bytes", items, MaxListItemLength, n+1, len(item))}
		}
		if n++; n <= MaxListItems {
			out = append(out, item)
		}
	}
	if n > MaxListItems {
		return nil, &AnnotationError{Key: key, Value: v, Allowed: fmt.Sprintf("must list at most %d %s, not %d", MaxListItems, items, n)}
	}
	return out, nil
}

// admits reports whether g passes c's model and UUID filters. modelOK and
// uuidOK tell which filter failed.
func (c Constraints) admits(g *GPU) (modelOK, uuidOK bool) {
	modelOK = len(c.Models) == 0
	for _, m := range c.Models {
		if containsFold(g.Model, m) {
			modelOK = true
			break
		}
	}
	for _, m := range c.ExcludeModels {
		if containsFold(g.Model, m) {
			modelOK = false
		}
	}
	uuidOK = len(c.UUIDs) == 0
	for _, u := range c.UUIDs {
		if g.UUID == u {
			uuidOK = true
			break
		}
	}
	for _, u := range c.ExcludeUUIDs {
		if g.UUID == u {
			uuidOK = false
		}
	}
	return modelOK, uuidOK
}

// containsFold reports whether sub is in s, ignoring case, without
// allocating.
func containsFold(s, sub string) bool {
	if sub == "" {
		return true
	}
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

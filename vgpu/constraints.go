package vgpu

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Policy says how to choose among places that fit: nodes (node policy) or
// GPUs inside a node (GPU policy). The empty Policy means "not set": the
// next default applies.
type Policy string

const (
	// PolicyBinpack prefers the fullest node, or the most-used GPU, that
	// fits, keeping whole GPUs and whole nodes free for large requests.
	PolicyBinpack Policy = "binpack"
	// PolicySpread prefers the emptiest node or least-used GPU, trading
	// packing for less interference between pods.
	PolicySpread Policy = "spread"
	// PolicyFragmentation prefers the placement that increases the node's
	// fragmentation the least, measured against a Workload of typical
	// requests (see Fragmentation).
	PolicyFragmentation Policy = "fragmentation"
)

// Policies lists the valid policies in the order messages show them.
func Policies() []Policy {
	return []Policy{PolicyBinpack, PolicySpread, PolicyFragmentation}
}

// ParsePolicy reads a policy name: exactly one of Policies, or "" for not
// set. Anything else is an error wrapping ErrMalformed.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies() {
		if s == string(p) {
			return p, nil
		}
	}
	if s == "" {
		return "", nil
	}
	return "", fmt.Errorf("%w: %q: must be one of %s", ErrMalformed, s, PolicyList())
}

// PolicyList is Policies joined with ", ", for messages.
func PolicyList() string {
	names := make([]string, 0, len(Policies()))
	for _, p := range Policies() {
		names = append(names, string(p))
	}
	return strings.Join(names, ", ")
}

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
	// Value is the value as written.
	Value string
	// Allowed says what would be accepted, e.g. "must be one of binpack,
	// spread, fragmentation".
	Allowed string
}

// Error renders e as `hami.io/gpu-policy="pack": must be one of binpack,
// spread, fragmentation`.
func (e *AnnotationError) Error() string {
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
// AnnotationGPUPolicy, AnnotationEnforcement) from annotations; other keys are ignored. Lists are
// comma-separated; blanks around items are trimmed and empty items
// dropped, so "A100, H100," is two models. On any invalid value it returns
// a zero Constraints and every problem at once (errors.Join of
// *AnnotationError, in key order). It is pure and safe to call
// concurrently.
func ParseConstraints(annotations map[string]string) (Constraints, error) {
	var c Constraints
	var errs []error
	c.Models = splitList(annotations[AnnotationGPUModel])
	c.ExcludeModels = splitList(annotations[AnnotationGPUModelExclude])
	c.UUIDs = splitList(annotations[AnnotationGPUUUID])
	c.ExcludeUUIDs = splitList(annotations[AnnotationGPUUUIDExclude])
	switch v := annotations[AnnotationNUMABind]; v {
	case "", "false":
	case "true":
		c.NUMABind = true
	default:
		errs = append(errs, &AnnotationError{Key: AnnotationNUMABind, Value: v, Allowed: `must be "true" or "false"`})
	}
	for _, k := range []struct {
		key string
		dst *Policy
	}{{AnnotationNodePolicy, &c.NodePolicy}, {AnnotationGPUPolicy, &c.GPUPolicy}} {
		v := annotations[k.key]
		p, err := ParsePolicy(v)
		if err != nil {
			errs = append(errs, &AnnotationError{Key: k.key, Value: v, Allowed: "must be one of " + PolicyList()})
		}
		*k.dst = p
	}
	if v := annotations[AnnotationEnforcement]; v != "" {
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

func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
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

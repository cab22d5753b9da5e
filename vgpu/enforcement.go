package vgpu

import (
	"fmt"
	"strings"
)

// Enforcement is the mechanism that holds a node's GPU containers to their
// slice. The device plugin picks one per node (the strongest the node
// has), publishes it in the node's inventory and LabelEnforcement, and
// gives every container the settings of that mechanism. The empty
// Enforcement means "not reported" (an inventory written before the field
// existed) and guards nothing, like EnforcementNone.
type Enforcement string

const (
	// EnforcementDriver is the NVIDIA driver's own per-cgroup memory
	// limit (driver R615+ on cgroup v2): the toolkit's CDI hook reads
	// NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT. Memory only.
	EnforcementDriver Enforcement = "driver"
	// EnforcementHAMiCore is HAMi-core's libvgpu.so, preloaded into every
	// GPU process: memory and compute limits from CUDA_DEVICE_* variables.
	EnforcementHAMiCore Enforcement = "hami-core"
	// EnforcementMPS is one CUDA MPS control daemon per shared GPU: the
	// pinned device memory limit and active thread percentage of each
	// client. It serves containers on one GPU.
	EnforcementMPS Enforcement = "mps"
	// EnforcementNone means nothing on the node enforces a slice: the
	// limits are only written into the container's environment.
	EnforcementNone Enforcement = "none"
)

// Enforcements lists the mechanisms from the strongest to none, the order
// in which the device plugin prefers them and messages show them.
func Enforcements() []Enforcement {
	return []Enforcement{EnforcementDriver, EnforcementHAMiCore, EnforcementMPS, EnforcementNone}
}

// EnforcementList is Enforcements joined with ", ", for messages.
func EnforcementList() string {
	names := make([]string, 0, len(Enforcements()))
	for _, e := range Enforcements() {
		names = append(names, string(e))
	}
	return strings.Join(names, ", ")
}

// ParseEnforcement reads a mechanism name: exactly one of Enforcements.
// Anything else, the empty string included, is an error wrapping
// ErrMalformed.
func ParseEnforcement(s string) (Enforcement, error) {
	for _, e := range Enforcements() {
		if s == string(e) {
			return e, nil
		}
	}
	return "", fmt.Errorf("%w: %q: must be one of %s", ErrMalformed, s, EnforcementList())
}

// Guards reports whether e enforces anything: false for EnforcementNone
// and the empty Enforcement.
func (e Enforcement) Guards() bool {
	return e != EnforcementNone && e != ""
}

// GuardsContainer reports whether a container on gpus GPUs of a node whose
// mechanism is e is held to its slice: e guards anything, and for MPS the
// container is on exactly one GPU (a client reaches one control daemon).
// A container on no GPU needs no guard.
func GuardsContainer(e Enforcement, gpus int) bool {
	if gpus == 0 {
		return true
	}
	if e == EnforcementMPS {
		return gpus == 1
	}
	return e.Guards()
}

// EnforcementRequirement is what a pod's AnnotationEnforcement asks of the
// node it lands on. The zero value asks nothing.
type EnforcementRequirement struct {
	// Required is true when the pod must land where its slices are
	// enforced.
	Required bool
	// Mechanism, when set, is the only mechanism the pod accepts; it
	// implies Required. Never EnforcementNone.
	Mechanism Enforcement
}

// EnforcementRequired is the AnnotationEnforcement value that accepts any
// mechanism that guards the pod.
const EnforcementRequired = "required"

// enforcementAllowed is the rule a bad AnnotationEnforcement breaks.
const enforcementAllowed = `must be "required" (any mechanism) or one of driver, hami-core, mps (that mechanism only); leave it unset to accept any node`

// parseEnforcementRequirement reads an AnnotationEnforcement value.
func parseEnforcementRequirement(v string) (EnforcementRequirement, bool) {
	switch v {
	case "":
		return EnforcementRequirement{}, true
	case EnforcementRequired:
		return EnforcementRequirement{Required: true}, true
	}
	e, err := ParseEnforcement(v)
	if err != nil || !e.Guards() {
		return EnforcementRequirement{}, false
	}
	return EnforcementRequirement{Required: true, Mechanism: e}, true
}

// admits reports whether a node whose mechanism is e satisfies r for a
// container on gpus GPUs.
func (r EnforcementRequirement) admits(e Enforcement, gpus int) bool {
	if !r.Required {
		return true
	}
	if r.Mechanism != "" && r.Mechanism != e && gpus > 0 {
		return false
	}
	return GuardsContainer(e, gpus)
}

// String renders r as the annotation value that asks for it.
func (r EnforcementRequirement) String() string {
	switch {
	case r.Mechanism != "":
		return string(r.Mechanism)
	case r.Required:
		return EnforcementRequired
	}
	return ""
}

package vgpu

import "unicode/utf8"

// Limits on what a pod's author writes and the components read back from the
// pod: every parser here checks them before it does work in proportion to the
// input, so one pod cannot make the scheduler extender, which judges every
// pod on every node under one lock, slow for all. The webhook rejects a pod
// that breaks one, naming it; the extender and the device plugin reject such
// a value again when it reaches them by another path (a namespace the
// webhook skips). docs/protocol.md lists them with their reasons.
const (
	// MaxPlacementValueLength is the most bytes of one placement
	// annotation's value (AnnotationGPUModel … AnnotationEnforcement),
	// blanks and commas included: MaxListItems items of MaxListItemLength
	// bytes, with a comma and a blank between them, fit in it.
	MaxPlacementValueLength = 4096
	// MaxListItems is the most items of one placement list
	// (AnnotationGPUModel, AnnotationGPUModelExclude, AnnotationGPUUUID,
	// AnnotationGPUUUIDExclude). A node holds 8 or 16 GPUs and a cluster a
	// handful of models; a list that names more GPUs than 32 is better
	// written as a model filter or a node selector.
	MaxListItems = 32
	// MaxListItemLength is the most bytes of one list item: NVML's buffers
	// for a device's name and UUID hold 96 bytes with the terminating NUL
	// (NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE),
	// so no longer item can be a model's substring or a GPU's UUID.
	MaxListItemLength = 96
	// MaxGPUContainersPerPod is the most containers and init containers of
	// one pod that may ask for GPUs (RequestFromPod) and that one
	// allocation may list (PodAllocation.Validate). Every one of them is
	// fitted on every node the pod is judged on.
	MaxGPUContainersPerPod = 32
	// MaxPodAllocationLength is the most bytes of an AnnotationPodAllocation
	// value ParsePodAllocation reads. The largest allocation the rules
	// allow, MaxGPUContainersPerPod containers of MaxGPUsPerContainer
	// slices with 96-byte UUIDs, encodes in about 80 KiB.
	MaxPodAllocationLength = 128 << 10
	// MaxShownValueRunes is the most runes of a value a message quotes
	// (Abbreviate).
	MaxShownValueRunes = 64
)

// PodAnnotationLimit is the most bytes a reader of key's value on a Pod
// reads: MaxPodAllocationLength for AnnotationPodAllocation,
// MaxPlacementValueLength for a placement annotation. ok is false for any
// other key: no part of gpuslice reads it from a Pod. A cache of pods may
// keep only these keys, and of a longer value its first limit+1 bytes: the
// parsers reject that as over the limit all the same.
func PodAnnotationLimit(key string) (limit int, ok bool) {
	switch key {
	case AnnotationPodAllocation:
		return MaxPodAllocationLength, true
	case AnnotationGPUModel, AnnotationGPUModelExclude, AnnotationGPUUUID, AnnotationGPUUUIDExclude,
		AnnotationNUMABind, AnnotationNodePolicy, AnnotationGPUPolicy, AnnotationEnforcement:
		return MaxPlacementValueLength, true
	}
	return 0, false
}

// Abbreviate returns s, or its first MaxShownValueRunes runes followed by
// "…" when it is longer: what a message quotes of a value a stranger wrote.
// It reads no more of s than it returns.
func Abbreviate(s string) string {
	if len(s) <= MaxShownValueRunes {
		return s
	}
	runes := 0
	for i := 0; i < len(s); {
		if runes == MaxShownValueRunes {
			return s[:i] + "…"
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		runes++
	}
	return s
}

package vgpu

import (
	"errors"
	"fmt"
	"math"
)

// NodeInventory is what a node offers for slicing: its GPUs and the knobs the
// device plugin was started with. The device plugin builds it from NVML and
// publishes it on the Node (AnnotationNodeInventory); the scheduler extender
// reads it to place pods. Methods never modify the receiver.
type NodeInventory struct {
	// Node is the Node's name; never empty.
	Node string
	// SplitCount is how many slices (containers) one GPU may hold at once,
	// at least 1. A whole-GPU (exclusive) container uses all of them.
	SplitCount int
	// MemoryScaling is the factor the device plugin applied to each GPU's
	// memory to get SchedulableMemoryMiB: 1 is none, above 1 overcommits.
	// Informational: schedulers use SchedulableMemoryMiB. Always > 0.
	MemoryScaling float64
	// Enforcement is the mechanism that enforces the node's slices; empty
	// when the device plugin did not report one (an older plugin).
	Enforcement Enforcement
	// GPUs are the node's GPUs in the device plugin's order (by Index).
	// Empty means the node has no usable GPU.
	GPUs []GPU
}

// GPU returns the GPU with this UUID, and false when the node has none.
func (n NodeInventory) GPU(uuid string) (GPU, bool) {
	for _, g := range n.GPUs {
		if g.UUID == uuid {
			return g, true
		}
	}
	return GPU{}, false
}

// Healthy returns how many of the node's GPUs are Healthy.
func (n NodeInventory) Healthy() int {
	count := 0
	for _, g := range n.GPUs {
		if g.Health == Healthy {
			count++
		}
	}
	return count
}

// Validate reports every way n breaks the rules stated on its fields and on
// GPU: empty node or UUID, SplitCount < 1, MemoryScaling not > 0, duplicate
// UUID or Index, negative numbers, CoresPercent above 100, unknown Health.
// Errors name the field path (e.g. "gpus[1].uuid") and the value. Writers
// call it before publishing; ParseNodeInventory calls it after decoding.
func (n NodeInventory) Validate() error {
	var errs []error
	if n.Node == "" {
		errs = append(errs, errors.New("node: must not be empty"))
	}
	if n.SplitCount < 1 {
		errs = append(errs, fmt.Errorf("splitCount=%d: must be at least 1", n.SplitCount))
	}
	if !(n.MemoryScaling > 0) || math.IsInf(n.MemoryScaling, 0) {
		errs = append(errs, fmt.Errorf("memoryScaling=%v: must be a finite number above 0", n.MemoryScaling))
	}
	if n.Enforcement != "" {
		if _, err := ParseEnforcement(string(n.Enforcement)); err != nil {
			errs = append(errs, fmt.Errorf("enforcement=%q: must be one of %s, or absent", n.Enforcement, EnforcementList()))
		}
	}
	uuids := make(map[string]int, len(n.GPUs))
	indexes := make(map[int]int, len(n.GPUs))
	for i, g := range n.GPUs {
		errs = append(errs, validateGPU(fmt.Sprintf("gpus[%d]", i), g)...)
		if j, dup := uuids[g.UUID]; dup && g.UUID != "" {
			errs = append(errs, fmt.Errorf("gpus[%d].uuid=%q: already used by gpus[%d]", i, g.UUID, j))
		} else {
			uuids[g.UUID] = i
		}
		if j, dup := indexes[g.Index]; dup {
			errs = append(errs, fmt.Errorf("gpus[%d].index=%d: already used by gpus[%d]", i, g.Index, j))
		} else {
			indexes[g.Index] = i
		}
	}
	return errors.Join(errs...)
}

func validateGPU(path string, g GPU) []error {
	var errs []error
	if g.UUID == "" {
		errs = append(errs, fmt.Errorf("%s.uuid: must not be empty", path))
	}
	if g.Index < 0 {
		errs = append(errs, fmt.Errorf("%s.index=%d: must not be negative", path, g.Index))
	}
	if g.Minor < 0 {
		errs = append(errs, fmt.Errorf("%s.minor=%d: must not be negative", path, g.Minor))
	}
	if g.TotalMemoryMiB <= 0 {
		errs = append(errs, fmt.Errorf("%s.totalMemoryMiB=%d: must be above 0", path, g.TotalMemoryMiB))
	}
	if g.SchedulableMemoryMiB < 0 {
		errs = append(errs, fmt.Errorf("%s.schedulableMemoryMiB=%d: must not be negative", path, g.SchedulableMemoryMiB))
	}
	if g.CoresPercent < 0 || g.CoresPercent > MaxPercent {
		errs = append(errs, fmt.Errorf("%s.coresPercent=%d: must be from 0 to %d", path, g.CoresPercent, MaxPercent))
	}
	if g.NUMANode < -1 {
		errs = append(errs, fmt.Errorf("%s.numaNode=%d: must be -1 (unknown) or above", path, g.NUMANode))
	}
	if g.Health != Healthy && g.Health != Unhealthy {
		errs = append(errs, fmt.Errorf("%s.health=%q: must be %q or %q", path, g.Health, Healthy, Unhealthy))
	}
	return errs
}

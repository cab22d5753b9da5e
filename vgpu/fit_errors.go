package vgpu

import (
	"fmt"
	"strings"
)

// filterCounts counts the GPUs left after each of Fit's filters, in order.
type filterCounts struct {
	healthy, model, uuid, slices, memory int
}

// explain builds the FitError for container ci, which needed more GPUs than
// the filters in f left.
func (s *fitState) explain(ci int, c Constraints, f filterCounts) error {
	cr := s.req.Containers[ci]
	k := cr.GPUs
	reason := f.reason(k)
	if s.reasonOnly {
		return &FitError{Reason: reason, Container: ci}
	}
	var msg string
	switch reason {
	case ReasonUnhealthy:
		switch {
		case len(s.node.GPUs) == 0:
			msg = fmt.Sprintf("not enough healthy GPUs: needs %d, node has no GPU", k)
		default:
			msg = fmt.Sprintf("not enough healthy GPUs: needs %d, node has %d healthy of %d", k, f.healthy, len(s.node.GPUs))
		}
	case ReasonModel:
		want := modelFilter(c)
		if f.model == 0 {
			msg = fmt.Sprintf("no GPU of model %s (node has: %s)", want, s.models())
		} else {
			msg = fmt.Sprintf("not enough GPUs of model %s: needs %d, node has %d (node has: %s)", want, k, f.model, s.models())
		}
	case ReasonUUID:
		msg = fmt.Sprintf("not enough GPUs pass the UUID filter (%s): needs %d, %d of %d healthy GPUs pass", uuidFilter(c), k, f.uuid, f.model)
	case ReasonNoFreeSlice:
		if cr.Exclusive {
			msg = fmt.Sprintf("no free slice: needs %s untouched for whole-GPU use, %d %s", gpus(k), f.slices, isAre(f.slices))
		} else {
			msg = fmt.Sprintf("no free slice: needs a free slice on %s, %d of %d %s one (at most %d slices per GPU)", gpus(k), f.slices, f.uuid, hasHave(f.uuid), s.node.SplitCount)
		}
	case ReasonInsufficientMemory:
		msg = s.memoryMessage(ci, c, k, f.memory)
	default:
		msg = s.coresMessage(ci, c, k, len(s.cands))
	}
	return &FitError{Reason: reason, Container: ci, Message: s.prefix(ci) + msg}
}

// reason is the Reason of a container needing k GPUs that f left too few
// of: the first filter that did.
func (f filterCounts) reason(k int) Reason {
	switch {
	case f.healthy < k:
		return ReasonUnhealthy
	case f.model < k:
		return ReasonModel
	case f.uuid < k:
		return ReasonUUID
	case f.slices < k:
		return ReasonNoFreeSlice
	case f.memory < k:
		return ReasonInsufficientMemory
	}
	return ReasonInsufficientCores
}

// NeedMessage says what container fe.Container of the pod needs that a
// node failing with fe.Reason lacks, in words that do not depend on the
// node ("insufficient memory: needs 8192 MiB on 1 GPU"), so that a
// scheduler that counts equal messages together shows one line per
// reason however many nodes fail. It names the container when the pod has
// more than one. Pure. Like every Fit message it holds no percent sign:
// kube-scheduler passes the messages it gets from an extender to its
// event recorder as a format string ("50%!o(MISSING)f GPU memory").
func NeedMessage(pod PodDemand, fe *FitError) string {
	cs := pod.Request.Containers
	if fe.Container < 0 || fe.Container >= len(cs) {
		return string(fe.Reason)
	}
	cr, c := cs[fe.Container], pod.Constraints
	k := cr.GPUs
	var msg string
	switch fe.Reason {
	case ReasonUnhealthy:
		msg = fmt.Sprintf("not enough healthy GPUs: needs %d", k)
	case ReasonModel:
		msg = fmt.Sprintf("not enough GPUs of model %s: needs %d", modelFilter(c), k)
	case ReasonUUID:
		msg = fmt.Sprintf("not enough GPUs pass the UUID filter (%s): needs %d", uuidFilter(c), k)
	case ReasonNoFreeSlice:
		if cr.Exclusive {
			msg = fmt.Sprintf("no free slice: needs %s untouched for whole-GPU use", gpus(k))
		} else {
			msg = fmt.Sprintf("no free slice: needs a free slice on %s", gpus(k))
		}
	case ReasonInsufficientMemory:
		need := fmt.Sprintf("%d MiB", cr.MemoryMiB)
		if cr.MemoryMiB == 0 {
			need = fmt.Sprintf("%d percent of GPU memory", cr.MemoryPercent)
		}
		msg = fmt.Sprintf("insufficient memory: needs %s on %s", need, each(k))
	case ReasonInsufficientCores:
		msg = fmt.Sprintf("insufficient cores: needs %d percent on %s", cr.CoresPercent, each(k))
	case ReasonNUMA:
		msg = fmt.Sprintf("no NUMA node has %d fitting GPUs for hami.io/numa-bind", k)
	case ReasonEnforcement:
		msg = fmt.Sprintf("GPU limits not enforced: %s=%s needs %s on %s", AnnotationEnforcement, c.Enforcement, enforcementWanted(c.Enforcement), gpus(k))
	default:
		msg = string(fe.Reason)
	}
	if len(cs) < 2 {
		return msg
	}
	if cr.Init {
		return fmt.Sprintf("init container %q: ", cr.Name) + msg
	}
	return fmt.Sprintf("container %q: ", cr.Name) + msg
}

// each is "1 GPU" or "each of n GPUs".
func each(n int) string {
	if n == 1 {
		return "1 GPU"
	}
	return fmt.Sprintf("each of %d GPUs", n)
}

func (s *fitState) memoryMessage(ci int, c Constraints, k, fitting int) string {
	cr := s.req.Containers[ci]
	best, bestFree := -1, int64(-1)
	s.eachSliceable(ci, c, func(gi int, memOK, _ bool) {
		if memOK {
			return
		}
		free := s.node.GPUs[gi].SchedulableMemoryMiB - s.total(gi).MemoryMiB
		if free > bestFree {
			best, bestFree = gi, free
		}
	})
	needs := fmt.Sprintf("%d MiB", cr.MemoryMiB)
	largest := fmt.Sprintf("%d MiB", bestFree)
	if cr.MemoryMiB == 0 {
		needs = fmt.Sprintf("%d percent of GPU memory", cr.MemoryPercent)
		if sched := s.node.GPUs[best].SchedulableMemoryMiB; sched > 0 {
			largest = fmt.Sprintf("%d percent (%d MiB)", bestFree*100/sched, bestFree)
		}
	}
	if k == 1 {
		return fmt.Sprintf("insufficient memory: needs %s, largest free %s on %s", needs, largest, s.node.GPUs[best].UUID)
	}
	return fmt.Sprintf("insufficient memory: needs %s on each of %s, %d %s it free; largest free elsewhere %s on %s",
		needs, gpus(k), fitting, hasHave(fitting), largest, s.node.GPUs[best].UUID)
}

func (s *fitState) coresMessage(ci int, c Constraints, k, fitting int) string {
	cr := s.req.Containers[ci]
	best, bestFree := -1, -1
	s.eachSliceable(ci, c, func(gi int, memOK, coresOK bool) {
		if !memOK || coresOK {
			return
		}
		free := s.node.GPUs[gi].CoresPercent - s.total(gi).CoresPercent
		if free > bestFree {
			best, bestFree = gi, free
		}
	})
	if k == 1 {
		return fmt.Sprintf("insufficient cores: needs %d percent, largest free %d percent on %s", cr.CoresPercent, bestFree, s.node.GPUs[best].UUID)
	}
	return fmt.Sprintf("insufficient cores: needs %d percent on each of %s, %d %s it free; largest free elsewhere %d percent on %s",
		cr.CoresPercent, gpus(k), fitting, hasHave(fitting), bestFree, s.node.GPUs[best].UUID)
}

// eachSliceable calls fn for each healthy, admitted GPU with a free slice
// for container ci, in index order.
func (s *fitState) eachSliceable(ci int, c Constraints, fn func(gi int, memOK, coresOK bool)) {
	for gi := range s.node.GPUs {
		g := &s.node.GPUs[gi]
		if g.Health != Healthy {
			continue
		}
		if modelOK, uuidOK := c.admits(g); !modelOK || !uuidOK {
			continue
		}
		if slicesOK, memOK, coresOK := s.check(ci, gi); slicesOK {
			fn(gi, memOK, coresOK)
		}
	}
}

func (s *fitState) numaError(ci int) error {
	if s.reasonOnly {
		return &FitError{Reason: ReasonNUMA, Container: ci}
	}
	counts := map[int]int{}
	var order []int
	for _, cd := range s.cands {
		n := s.node.GPUs[cd.gi].NUMANode
		if counts[n] == 0 {
			order = append(order, n)
		}
		counts[n]++
	}
	parts := make([]string, 0, len(order))
	for _, n := range order {
		parts = append(parts, fmt.Sprintf("%d: %d", n, counts[n]))
	}
	k := s.req.Containers[ci].GPUs
	return &FitError{Reason: ReasonNUMA, Container: ci, Message: s.prefix(ci) + fmt.Sprintf(
		"no NUMA node has %d fitting GPUs for hami.io/numa-bind (fitting GPUs per NUMA node: %s)", k, strings.Join(parts, ", "))}
}

// prefix names the container when the pod has more than one.
func (s *fitState) prefix(ci int) string {
	if len(s.req.Containers) < 2 {
		return ""
	}
	cr := s.req.Containers[ci]
	if cr.Init {
		return fmt.Sprintf("init container %q: ", cr.Name)
	}
	return fmt.Sprintf("container %q: ", cr.Name)
}

// models lists the node's healthy GPU models with counts, in index order
// of first appearance: "Tesla T4 x4, NVIDIA A10 x1".
func (s *fitState) models() string {
	counts := map[string]int{}
	var order []string
	for _, g := range s.node.GPUs {
		if g.Health != Healthy {
			continue
		}
		if counts[g.Model] == 0 {
			order = append(order, g.Model)
		}
		counts[g.Model]++
	}
	parts := make([]string, 0, len(order))
	for _, m := range order {
		parts = append(parts, fmt.Sprintf("%s x%d", m, counts[m]))
	}
	return strings.Join(parts, ", ")
}

func modelFilter(c Constraints) string {
	var parts []string
	if len(c.Models) > 0 {
		parts = append(parts, strings.Join(c.Models, " or "))
	}
	if len(c.ExcludeModels) > 0 {
		parts = append(parts, "not "+strings.Join(c.ExcludeModels, " nor "))
	}
	return strings.Join(parts, " and ")
}

func uuidFilter(c Constraints) string {
	var parts []string
	if len(c.UUIDs) > 0 {
		parts = append(parts, AnnotationGPUUUID+"="+strings.Join(c.UUIDs, ","))
	}
	if len(c.ExcludeUUIDs) > 0 {
		parts = append(parts, AnnotationGPUUUIDExclude+"="+strings.Join(c.ExcludeUUIDs, ","))
	}
	return strings.Join(parts, "; ")
}

func gpus(n int) string {
	if n == 1 {
		return "1 GPU"
	}
	return fmt.Sprintf("%d GPUs", n)
}

func hasHave(n int) string {
	if n == 1 {
		return "has"
	}
	return "have"
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

// checkEnforcement returns the FitError of the first container, in request
// order, that the node's mechanism does not guard as r asks, or nil.
func (s *fitState) checkEnforcement(r EnforcementRequirement) error {
	if !r.Required {
		return nil
	}
	have := s.node.Enforcement
	for ci, cr := range s.req.Containers {
		if r.admits(have, cr.GPUs) {
			continue
		}
		if s.reasonOnly {
			return &FitError{Reason: ReasonEnforcement, Container: ci}
		}
		shown := string(have)
		if shown == "" {
			shown = "not reported"
		}
		msg := fmt.Sprintf("GPU limits not enforced: %s=%s needs %s on %s, node's mechanism is %s", AnnotationEnforcement, r, enforcementWanted(r), gpus(cr.GPUs), shown)
		if have == EnforcementMPS && cr.GPUs > 1 {
			msg += " (an MPS client reaches one GPU)"
		}
		return &FitError{Reason: ReasonEnforcement, Container: ci, Message: s.prefix(ci) + msg}
	}
	return nil
}

// enforcementWanted says in words what r accepts.
func enforcementWanted(r EnforcementRequirement) string {
	if r.Mechanism != "" {
		return "mechanism " + string(r.Mechanism)
	}
	return "a mechanism that guards"
}

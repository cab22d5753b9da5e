package deviceplugin

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
)

// reportEnforcement records the Normal event that names the mechanism
// guarding container ref of pod, holding ca.
func (a *allocator) reportEnforcement(ref containerRef, pod *corev1.Pod, ca vgpu.ContainerAllocation) {
	if a.events == nil || pod == nil {
		return
	}
	a.events.Eventf(pod, corev1.EventTypeNormal, handoff.ReasonEnforced, "container %s: %s", ref.Container, enforcementMessage(a.enforcement, a.driverUnverified, a.cfg.NodeName, ca))
}

// reportEnforcementFromView is reportEnforcement for a container whose pod
// the view already shows (mode env, after verifyBinding): it reads the
// allocation as the view has it now and never waits, so the start is not
// held up for an event; without a readable allocation there is none.
func (a *allocator) reportEnforcementFromView(ref containerRef) {
	pod, ok := a.pods.Pod(ref.Namespace, ref.Pod)
	if !ok {
		return
	}
	alloc, ok, err := a.pods.Allocation(pod)
	if !ok {
		return
	}
	if pod, ca, err := a.containerAllocation(ref, pod, alloc, err); err == nil {
		a.reportEnforcement(ref, pod, ca)
	}
}

// enforcementMessage says, for a person, what guards a container holding
// ca on node under mechanism mech; unverified marks a driver mechanism
// taken on the operator's word.
func enforcementMessage(mech vgpu.Enforcement, unverified bool, node string, ca vgpu.ContainerAllocation) string {
	if len(ca.GPUs) == 0 {
		return "no GPU slice"
	}
	s := ca.GPUs[0]
	switch {
	case mech == vgpu.EnforcementMPS && len(ca.GPUs) > 1:
		return fmt.Sprintf("enforcement none: node %s uses MPS, which serves containers on one GPU; this one has %d, so its limits are only in its environment", node, len(ca.GPUs))
	case !mech.Guards():
		return fmt.Sprintf("enforcement none: node %s has no enforcement mechanism; the limits (%d MiB per GPU) are only in the environment", node, s.MemoryMiB)
	case mech == vgpu.EnforcementDriver && unverified:
		return fmt.Sprintf("enforcement driver, unverified: the NVIDIA driver limits GPU memory to %d MiB per GPU (%s) if the runtime runs the toolkit's memory-limit hook, which no CDI spec on node %s shows (enforcementDriverHook=assume); compute is not limited", handoff.MinMemoryMiB(ca), handoff.EnvGPUMemoryLimit, node)
	case mech == vgpu.EnforcementDriver:
		return fmt.Sprintf("enforcement driver: the NVIDIA driver limits GPU memory to %d MiB per GPU (%s); compute is not limited", handoff.MinMemoryMiB(ca), handoff.EnvGPUMemoryLimit)
	case mech == vgpu.EnforcementHAMiCore:
		msg := fmt.Sprintf("enforcement hami-core: libvgpu.so limits GPU memory to %d MiB per GPU", s.MemoryMiB)
		if s.CoresPercent > 0 {
			return msg + fmt.Sprintf(" and compute to %d%%", s.CoresPercent)
		}
		return msg + "; compute is not limited"
	}
	msg := fmt.Sprintf("enforcement mps: the MPS control daemon of GPU %s limits device memory to %d MiB", s.UUID, s.MemoryMiB)
	if s.CoresPercent > 0 && s.CoresPercent < vgpu.MaxPercent {
		return msg + fmt.Sprintf(" and active threads to %d%%", s.CoresPercent)
	}
	return msg + "; threads are not limited"
}

package deviceplugin

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
)

// enforcementChoice is the node's enforcement mechanism as Run picks it.
type enforcementChoice struct {
	mech vgpu.Enforcement
	// qualified says detection agrees with a forced mechanism.
	qualified bool
	// facts are Options.Facts with the memory-limit hook detected.
	facts handoff.NodeFacts
	// driver says whether the node qualifies for driver, and why not.
	driver handoff.DriverQualification
}

// unverified says the node uses driver on the operator's word.
func (c enforcementChoice) unverified() bool {
	return c.mech == vgpu.EnforcementDriver && c.driver.Unverified
}

// nvidiaCDI returns the NVIDIA toolkit's CDI devices containers get: those
// of the GPUs under driver, none under another mechanism.
func (c enforcementChoice) nvidiaCDI() map[string]string {
	if c.mech != vgpu.EnforcementDriver {
		return nil
	}
	return c.facts.DriverHook.Devices
}

// chooseEnforcement picks the mechanism of a node with facts whose
// advertised GPUs are gpus: it first reads the NVIDIA toolkit's CDI specs
// (cfg.NVIDIACDISpecs) for the devices and memory-limit hook of gpus
// (handoff.DetectDriverHook; a spec that cannot be read is logged), then
// applies handoff.ChooseEnforcement. It logs the choice, and why driver
// is not used or not verified.
func chooseEnforcement(logger klog.Logger, cfg Config, facts handoff.NodeFacts, gpus []vgpu.GPU) (enforcementChoice, error) {
	hook, err := handoff.DetectDriverHook(cfg.NVIDIACDISpecs, gpus)
	if err != nil {
		logger.Error(err, "Reading the NVIDIA CDI specs")
	}
	facts.DriverHook = hook
	ecfg := cfg.EnforcementConfig()
	mech, qualified, err := handoff.ChooseEnforcement(ecfg, facts)
	if err != nil {
		return enforcementChoice{}, err
	}
	c := enforcementChoice{mech: mech, qualified: qualified, facts: facts, driver: handoff.QualifyDriver(ecfg, facts)}
	logger.Info("Enforcement", "mechanism", mech, "qualifies", handoff.QualifiedEnforcements(ecfg, facts),
		"driverVersion", facts.DriverVersion, "cgroupVersion", facts.CgroupVersion, "mpsControl", facts.MPSControl,
		"nvidiaCDIDevices", len(hook.Devices), "memoryLimitHook", hook.Found, "gpus", len(gpus))
	switch {
	case !qualified:
		logger.Info("Warning: the enforcement mechanism is forced on a node that does not qualify for it", "mechanism", mech, "driver", c.driver.Reason)
	case c.unverified():
		logger.Info("Warning: enforcement driver is unverified", "reason", c.driver.Reason)
	case mech != vgpu.EnforcementDriver:
		logger.Info("Enforcement driver not offered", "reason", c.driver.Reason, "mechanism", mech)
	}
	return c, nil
}

// enforcementNodeEvent records on the Node which mechanism guards its GPU
// containers and, when it is not a verified driver, why: a Warning when
// driver is unverified, or not offered for want of the memory-limit hook
// on a node that has the driver and cgroup for it.
func (p *Plugin) enforcementNodeEvent(c enforcementChoice) {
	eventtype := corev1.EventTypeNormal
	msg := "enforcement " + string(c.mech)
	hookOnly := handoff.QualifyDriver(handoff.EnforcementConfig{DriverHook: handoff.DriverHookAssume}, c.facts).Qualifies
	switch {
	case c.unverified():
		eventtype = corev1.EventTypeWarning
		msg += " (" + c.driver.Reason + ")"
	case c.mech == vgpu.EnforcementDriver:
		msg += ": the NVIDIA toolkit's CDI specs run nvidia-cdi-hook " + handoff.MemoryLimitHook + " for every GPU"
	default:
		if hookOnly {
			eventtype = corev1.EventTypeWarning
		}
		msg += "; driver is not offered: " + c.driver.Reason
	}
	p.nodeEvent(eventtype, handoff.ReasonEnforced, "%s", msg)
}

package deviceplugin

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
)

// builder returns the node's container-edit builder: the plugin's settings,
// its inventory's GPUs and the enforcement mechanism Run chose.
func (a *allocator) builder() *handoff.Builder {
	return &handoff.Builder{
		NodeName:       a.cfg.NodeName,
		GPU:            a.inv.gpu,
		SharedCacheDir: a.cfg.SharedCacheDir,
		FakeGPUs:       a.cfg.FakeGPUs != "",
		Enforcement:    a.enforcement,
		HostLibVGPU:    a.cfg.HostLibVGPU,
		StateDir:       a.cfg.EffectiveStateDir(),
		MPSDir:         a.cfg.MPSDir,
		NVIDIACDI:      a.nvidiaCDI,
	}
}

// editsFor builds what container ca of pod gets (handoff.Builder.EditsFor).
func (a *allocator) editsFor(pod *corev1.Pod, ca vgpu.ContainerAllocation) (handoff.Edits, error) {
	return a.builder().EditsFor(pod, ca)
}

// nvidiaDevicesFor returns the NVIDIA CDI devices of gpus under the driver
// mechanism (handoff.Builder.NVIDIADevicesFor).
func (a *allocator) nvidiaDevicesFor(gpus []string) []string {
	return a.builder().NVIDIADevicesFor(gpus)
}

// EnforcementConfig is c's enforcement settings.
func (c Config) EnforcementConfig() handoff.EnforcementConfig {
	return handoff.EnforcementConfig{
		Enforcement:         c.Enforcement,
		DisabledEnforcement: c.DisabledEnforcement,
		HostLibVGPU:         c.HostLibVGPU,
		MPSControl:          c.MPSControl,
		DriverHook:          c.EnforcementDriverHook,
	}
}

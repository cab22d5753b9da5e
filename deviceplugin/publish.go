package deviceplugin

import (
	"github.com/gpuslice/gpuslice/node/publish"
	"github.com/gpuslice/gpuslice/vgpu"
)

// fieldManager is the plugin's name in the managed fields of what it
// writes, and its heartbeat Lease's holder (publish.HolderIdentity).
const fieldManager = "gpuslice-device-plugin"

// publishConfig is what the publisher needs of the plugin's Config: the
// inventory annotation and labels too, since the extender places the
// plugin's pods by them.
func (p *Plugin) publishConfig() publish.Config {
	return publish.Config{
		NodeName:           p.cfg.NodeName,
		ResourceName:       p.cfg.ResourceName,
		Version:            p.opts.PluginVersion,
		FieldManager:       fieldManager,
		HeartbeatNamespace: p.cfg.HeartbeatNamespace,
		LeaseDuration:      p.cfg.LeaseDuration.Duration,
		LeaseRenew:         p.cfg.LeaseRenew.Duration,
		NodeInventory:      true,
		Stopped:            registration{Problem: vgpu.ReasonPluginStopped, Detail: "the device plugin stopped; the kubelet drops its devices until a plugin registers again"},
	}
}

// publishSource is the plugin's state as the publisher reads it.
type publishSource struct {
	p   *Plugin
	inv *inventory
}

func (s publishSource) Inventory() (vgpu.NodeInventory, <-chan struct{}) {
	node, _, changed := s.inv.snapshot()
	return node, changed
}

func (s publishSource) Registration() (publish.Registration, <-chan struct{}) {
	return s.p.registration()
}

func (s publishSource) Condition(reg publish.Registration, node vgpu.NodeInventory) (publish.Condition, bool) {
	return desiredCondition(s.p.cfg, reg, node)
}

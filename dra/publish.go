package dra

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/node/publish"
	"github.com/gpuslice/gpuslice/vgpu"
)

// FieldManager is the driver's name in the managed fields of what it
// writes on its Node and heartbeat Lease, and the Lease's holder.
const FieldManager = "gpuslice-dra-plugin"

// registrationPoll is how often the driver reads the kubelet's answer to
// its registration: the helper records it without telling anyone.
const registrationPoll = time.Second

// publishConfig is what the publisher needs: the node condition and the
// heartbeat Lease, in DRA mode (the ResourceSlice is the inventory; the
// node has no ready label, which the extender would read as a
// device-plugin node's).
func (d *Driver) publishConfig(version string) publish.Config {
	return publish.Config{
		NodeName:           d.cfg.NodeName,
		Mode:               vgpu.NodeModeDRA,
		ResourceName:       d.cfg.DriverName,
		Version:            version,
		FieldManager:       FieldManager,
		HeartbeatNamespace: d.cfg.HeartbeatNamespace,
		LeaseDuration:      d.cfg.LeaseDuration.Duration,
		LeaseRenew:         d.cfg.LeaseRenew.Duration,
		Stopped: publish.Registration{Problem: vgpu.ReasonPluginStopped,
			Detail: "the DRA driver stopped; prepared claims keep their devices, claims allocated here are not prepared until it runs again"},
	}
}

// socket is the driver's DRA socket as the kubelet is told of it.
func (d *Driver) socket() string { return filepath.Join(d.cfg.PluginDir, "dra.sock") }

// Inventory implements publish.Source: the GPUs the ResourceSlice lists.
func (d *Driver) Inventory() (vgpu.NodeInventory, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return vgpu.NodeInventory{Node: d.cfg.NodeName, GPUs: slices.Clone(d.gpus), MemoryScaling: d.cfg.MemoryScaling, Enforcement: d.mech}, d.invSig
}

// Registration implements publish.Source: the kubelet's answer to the
// driver's registration, as pollRegistration last read it.
func (d *Driver) Registration() (publish.Registration, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reg, d.regSig
}

// Condition implements publish.Source: True while the kubelet has the
// driver registered and a GPU is healthy.
func (d *Driver) Condition(reg publish.Registration, node vgpu.NodeInventory) (publish.Condition, bool) {
	return draCondition(d.cfg.DriverName, reg, node)
}

// draCondition is Driver.Condition, pure.
func draCondition(driver string, reg publish.Registration, node vgpu.NodeInventory) (publish.Condition, bool) {
	if !reg.Registered {
		if reg.Problem == "" {
			return publish.Condition{}, false
		}
		return publish.Condition{Status: corev1.ConditionFalse, Reason: reg.Problem, Message: reg.Detail}, true
	}
	healthy := 0
	for _, g := range node.GPUs {
		if g.Health == vgpu.Healthy {
			healthy++
		}
	}
	if healthy == 0 {
		msg := fmt.Sprintf("registered DRA driver %s with the kubelet, but it publishes no GPU (excludeGPUs leaves none)", driver)
		if len(node.GPUs) > 0 {
			msg = fmt.Sprintf("registered DRA driver %s with the kubelet, but all %d GPUs are unhealthy: their devices are tainted", driver, len(node.GPUs))
		}
		return publish.Condition{Status: corev1.ConditionFalse, Reason: vgpu.ReasonNoHealthyGPUs, Message: msg}, true
	}
	return publish.Condition{Status: corev1.ConditionTrue, Reason: vgpu.ReasonRegistered,
		Message: fmt.Sprintf("registered DRA driver %s with the kubelet: %d of %d GPUs healthy, in ResourceSlice pool %s", driver, healthy, len(node.GPUs), node.Node)}, true
}

// setRegistration records r and wakes the publisher when it changed.
func (d *Driver) setRegistration(r publish.Registration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.reg.Registered == r.Registered && d.reg.Problem == r.Problem && d.reg.Detail == r.Detail {
		return
	}
	d.reg = r
	close(d.regSig)
	d.regSig = make(chan struct{})
}

// inventoryChanged wakes the publisher after a health change.
func (d *Driver) inventoryChanged() {
	d.mu.Lock()
	defer d.mu.Unlock()
	close(d.invSig)
	d.invSig = make(chan struct{})
}

// pollRegistration reads the kubelet's answer to the registration every
// registrationPoll until ctx ends.
func (d *Driver) pollRegistration(ctx context.Context) {
	t := time.NewTicker(registrationPoll)
	defer t.Stop()
	for {
		d.mu.Lock()
		helper := d.helper
		d.mu.Unlock()
		if st := helper.RegistrationStatus(); st != nil {
			now := d.opts.Clock.Now()
			if st.PluginRegistered {
				d.setRegistration(publish.Registration{Registered: true, Since: now, Socket: d.socket()})
			} else {
				d.setRegistration(publish.Registration{Since: now, Problem: vgpu.ReasonRegisterFailed,
					Detail: fmt.Sprintf("the kubelet did not accept the DRA driver %s: %s", d.cfg.DriverName, st.Error)})
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

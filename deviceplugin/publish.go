package deviceplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/vgpu"
)

// fieldManager is the plugin's name in the managed fields of what it writes.
const fieldManager = "gpuslice-device-plugin"

// Publishing back-off after API errors, and the time allowed for the final
// "not ready" write when the plugin stops.
const (
	publishRetryInitial = 200 * time.Millisecond
	publishRetryMax     = 10 * time.Second
	finalWriteTimeout   = 5 * time.Second
)

// publisher keeps the API server informed, in the background: the inventory
// annotation and ready label on the Node (written only when they change)
// and the heartbeat Lease (renewed every LeaseRenew). It never blocks the
// kubelet side; failures are retried with back-off.
type publisher struct {
	client  API
	cfg     Config
	clock   clock.WithTicker
	inv     *inventory
	plugin  *Plugin
	version string

	// What the API server is known to hold; reset after errors.
	nodeKnown     bool
	nodeUID       types.UID
	nodeInventory string
	nodeReady     string
	// nodeEnforcement is the Node's vgpu.LabelEnforcement.
	nodeEnforcement string
	// nodeCondition is the Node's vgpu.ConditionRegistered, nil if none.
	nodeCondition *corev1.NodeCondition
	// recheck, when above 0, is when run must reconcile again for a
	// condition change syncCondition deferred.
	recheck      time.Duration
	lease        *coordinationv1.Lease
	leaseRenewed time.Time
}

func (p *publisher) run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("publisher")
	delay := publishRetryInitial
	failures := 0
	for {
		node, _, invChanged := p.inv.snapshot()
		reg, regChanged := p.plugin.registration()
		var wait time.Duration
		if err := p.reconcile(ctx, node, reg); err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			if failures == 1 || failures%10 == 0 {
				logger.Info("Publishing to the API server failed; retrying", "failures", failures, "retryIn", delay, "err", err.Error())
			}
			wait, delay = delay, min(2*delay, publishRetryMax)
		} else {
			if failures > 0 {
				logger.Info("Published to the API server", "afterFailures", failures)
			}
			failures, delay = 0, publishRetryInitial
			wait = max(0, p.cfg.LeaseRenew.Duration-p.clock.Since(p.leaseRenewed))
			if p.recheck > 0 {
				wait = min(wait, p.recheck)
			}
		}
		timer := p.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-invChanged:
		case <-regChanged:
		case <-timer.C():
		}
		timer.Stop()
		if ctx.Err() != nil {
			break
		}
	}
	// The plugin stops: lift the scheduling barrier while we still can.
	final, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
	defer cancel()
	node, _, _ := p.inv.snapshot()
	stopped := registration{Problem: vgpu.ReasonPluginStopped, Detail: "the device plugin stopped; the kubelet drops its devices until a plugin registers again"}
	if err := p.reconcile(final, node, stopped); err != nil {
		logger.Error(err, "Could not mark the node not ready on the way out")
	}
}

// reconcile makes the Node (labels, inventory, vgpu.ConditionRegistered)
// and the Lease match node and reg.
func (p *publisher) reconcile(ctx context.Context, node vgpu.NodeInventory, reg registration) error {
	inventory, err := vgpu.EncodeNodeInventory(node)
	if err != nil {
		return fmt.Errorf("encode inventory: %w", err)
	}
	ready := "false"
	if reg.Registered {
		ready = "true"
	}
	// After a renewal gap the extender may have turned the condition
	// Unknown meanwhile: read the Node again rather than trust the past.
	if !p.leaseRenewed.IsZero() && p.clock.Since(p.leaseRenewed) > p.cfg.LeaseDuration.Duration {
		p.nodeKnown = false
	}
	p.recheck = 0
	syncNode := func() error {
		err := p.syncNode(ctx, inventory, ready, string(node.Enforcement))
		if want, ok := desiredCondition(p.cfg, reg, node); err == nil && ok {
			err = p.syncCondition(ctx, reg, want)
		}
		if err != nil {
			p.nodeKnown = false
			return err
		}
		return nil
	}
	syncLease := func() error {
		if err := p.syncLease(ctx, reg); err != nil {
			p.lease = nil
			return err
		}
		return nil
	}
	// The scheduler retries a pod it could not place when a Node changes,
	// never when a Lease does, and the extender also reads the Lease. So the
	// Node's label changes last on the way up (the heartbeat already says
	// registered when the retry comes) and first on the way down.
	if reg.Registered {
		if err := syncLease(); err != nil {
			return err
		}
		return syncNode()
	}
	if err := syncNode(); err != nil {
		return err
	}
	return syncLease()
}

// syncNode patches the Node's inventory annotation, ready label and
// enforcement label when they differ from what the Node holds. It reads
// the Node only when its state is unknown (start, after an error).
func (p *publisher) syncNode(ctx context.Context, inventory, ready, enforcement string) error {
	if !p.nodeKnown {
		n, err := p.client.GetNode(ctx, p.cfg.NodeName)
		if err != nil {
			return fmt.Errorf("get node %s: %w", p.cfg.NodeName, err)
		}
		p.remember(n)
	}
	if p.nodeInventory == inventory && p.nodeReady == ready && p.nodeEnforcement == enforcement {
		return nil
	}
	labels := map[string]string{vgpu.LabelGPUReady: ready}
	if enforcement != "" {
		labels[vgpu.LabelEnforcement] = enforcement
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels":      labels,
		"annotations": map[string]string{vgpu.AnnotationNodeInventory: inventory},
	}})
	if err != nil {
		return fmt.Errorf("node patch: %w", err)
	}
	n, err := p.client.PatchNode(ctx, p.cfg.NodeName, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil {
		return fmt.Errorf("patch node %s: %w", p.cfg.NodeName, err)
	}
	p.remember(n)
	return nil
}

func (p *publisher) remember(n *corev1.Node) {
	p.nodeKnown = true
	p.nodeUID = n.UID
	p.nodeInventory = n.Annotations[vgpu.AnnotationNodeInventory]
	p.nodeReady = n.Labels[vgpu.LabelGPUReady]
	p.nodeEnforcement = n.Labels[vgpu.LabelEnforcement]
	p.nodeCondition = nil
	if c, ok := vgpu.RegisteredCondition(n); ok {
		p.nodeCondition = &c
	}
}

// syncLease creates or renews the heartbeat Lease. The heartbeat annotation
// changes only with the registration; renewTime moves on every renewal. A
// Lease without vgpu.LabelHeartbeat (written by an older plugin, or
// edited) is renewed at once and gets the label back, since readers watch
// only labelled Leases.
func (p *publisher) syncLease(ctx context.Context, reg registration) error {
	name := vgpu.HeartbeatLeaseName(p.cfg.NodeName)
	heartbeat, err := vgpu.EncodePluginHeartbeat(vgpu.PluginHeartbeat{
		Node:          p.cfg.NodeName,
		PluginVersion: p.version,
		ResourceName:  p.cfg.ResourceName,
		Registered:    reg.Registered,
		RegisteredAt:  reg.Since,
		Socket:        reg.Socket,
	})
	if err != nil {
		return fmt.Errorf("encode heartbeat: %w", err)
	}
	if p.lease == nil {
		l, err := p.client.GetLease(ctx, p.cfg.HeartbeatNamespace, name)
		switch {
		case apierrors.IsNotFound(err):
			l, err = p.client.CreateLease(ctx, p.newLease(name, heartbeat), metav1.CreateOptions{FieldManager: fieldManager})
			if err != nil {
				return fmt.Errorf("create lease %s/%s: %w", p.cfg.HeartbeatNamespace, name, err)
			}
			p.lease, p.leaseRenewed = l, p.clock.Now()
			return nil
		case err != nil:
			return fmt.Errorf("get lease %s/%s: %w", p.cfg.HeartbeatNamespace, name, err)
		}
		p.lease = l
	}
	if p.lease.Annotations[vgpu.AnnotationPluginHeartbeat] == heartbeat && p.lease.Labels[vgpu.LabelHeartbeat] == vgpu.LabelHeartbeatValue &&
		!p.leaseRenewed.IsZero() && p.clock.Since(p.leaseRenewed) < p.cfg.LeaseRenew.Duration {
		return nil
	}
	l := p.lease.DeepCopy()
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[vgpu.AnnotationPluginHeartbeat] = heartbeat
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[vgpu.LabelHeartbeat] = vgpu.LabelHeartbeatValue
	now := metav1.NewMicroTime(p.clock.Now())
	l.Spec.RenewTime = &now
	l.Spec.HolderIdentity = ptr.To(holderIdentity(p.cfg.NodeName))
	l.Spec.LeaseDurationSeconds = ptr.To(p.leaseSeconds())
	if len(l.OwnerReferences) == 0 && p.nodeUID != "" {
		l.OwnerReferences = p.ownerReferences()
	}
	l, err = p.client.UpdateLease(ctx, l, metav1.UpdateOptions{FieldManager: fieldManager})
	if err != nil {
		return fmt.Errorf("renew lease %s/%s: %w", p.cfg.HeartbeatNamespace, name, err)
	}
	p.lease, p.leaseRenewed = l, p.clock.Now()
	return nil
}

func (p *publisher) newLease(name, heartbeat string) *coordinationv1.Lease {
	now := metav1.NewMicroTime(p.clock.Now())
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Namespace:       p.cfg.HeartbeatNamespace,
			Labels:          map[string]string{vgpu.LabelHeartbeat: vgpu.LabelHeartbeatValue},
			Annotations:     map[string]string{vgpu.AnnotationPluginHeartbeat: heartbeat},
			OwnerReferences: p.ownerReferences(),
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(holderIdentity(p.cfg.NodeName)),
			LeaseDurationSeconds: ptr.To(p.leaseSeconds()),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
}

// ownerReferences ties the Lease to its Node, so deleting the Node collects
// the Lease (as the kubelet's node leases are).
func (p *publisher) ownerReferences() []metav1.OwnerReference {
	if p.nodeUID == "" {
		return nil
	}
	return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: p.cfg.NodeName, UID: p.nodeUID}}
}

// leaseSeconds is LeaseDuration in whole seconds, capped to the field's range.
func (p *publisher) leaseSeconds() int32 {
	return int32(min(p.cfg.LeaseDuration.Duration/time.Second, math.MaxInt32)) //nolint:gosec // G115: capped above.
}

func holderIdentity(node string) string { return "gpuslice-device-plugin/" + node }

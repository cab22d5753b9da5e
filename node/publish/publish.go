package publish

import (
	"context"
	"encoding/json"
	"errors"
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

// Publishing back-off after API errors, and the time allowed for the final
// "not ready" write when the agent stops.
const (
	RetryInitial      = 200 * time.Millisecond
	RetryMax          = 10 * time.Second
	finalWriteTimeout = 5 * time.Second
)

// API is the publisher's access to the API server: its own Node and its
// heartbeat Lease. Methods return the API server's errors as they come, so
// that apierrors.IsNotFound and the like work on them.
type API interface {
	// GetNode returns the Node name.
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
	// PatchNode applies the JSON merge patch data to the Node name and
	// returns the Node as the API server stored it.
	PatchNode(ctx context.Context, name string, data []byte, opts metav1.PatchOptions) (*corev1.Node, error)
	// PatchNodeStatus applies the strategic merge patch data to the status
	// of the Node name (conditions merge by type) and returns the Node as
	// the API server stored it.
	PatchNodeStatus(ctx context.Context, name string, data []byte, opts metav1.PatchOptions) (*corev1.Node, error)
	// GetLease returns the Lease namespace/name.
	GetLease(ctx context.Context, namespace, name string) (*coordinationv1.Lease, error)
	// CreateLease creates lease in lease.Namespace and returns it as stored.
	CreateLease(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	// UpdateLease replaces lease (its resourceVersion is the
	// precondition) and returns it as stored.
	UpdateLease(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
}

// Registration is the agent's registration with the kubelet.
type Registration struct {
	Registered bool
	// Since is when Registered last changed, or when the current Problem
	// began.
	Since time.Time
	// Socket is the agent's socket as given to the kubelet.
	Socket string
	// Problem, while not registered, is why (a vgpu.Reason… constant of
	// vgpu.ConditionRegistered) and Detail says it for a user; empty
	// before the first registration attempt and between rounds.
	Problem, Detail string
}

// Condition is the vgpu.ConditionRegistered the agent's state calls for.
type Condition struct {
	Status  corev1.ConditionStatus
	Reason  string
	Message string
}

// Source is the agent's state. Its methods are safe for concurrent use;
// each returns, beside the state, a channel closed when the state changes.
type Source interface {
	// Inventory returns the node's GPUs as the agent advertises them.
	Inventory() (vgpu.NodeInventory, <-chan struct{})
	// Registration returns the agent's registration with the kubelet.
	Registration() (Registration, <-chan struct{})
	// Condition maps a registration and an inventory to the condition;
	// false when the state says nothing yet (before the first
	// registration attempt). It is a pure function of its arguments.
	Condition(reg Registration, node vgpu.NodeInventory) (Condition, bool)
}

// Config configures a Publisher.
type Config struct {
	// NodeName is the agent's Node.
	NodeName string
	// Mode is the agent's mode, written into the heartbeat: "" for the
	// device plugin, vgpu.NodeModeDRA for the DRA driver.
	Mode string
	// ResourceName is what the agent registered with the kubelet: the
	// extended resource (device plugin) or the DRA driver's name.
	ResourceName string
	// Version is the agent's build version, written into the heartbeat.
	Version string
	// FieldManager names the agent's writes, e.g. "gpuslice-device-plugin";
	// the Lease's holder identity is FieldManager/NodeName.
	FieldManager string
	// HeartbeatNamespace is where the heartbeat Lease lives.
	HeartbeatNamespace string
	// LeaseDuration is the Lease's leaseDurationSeconds; LeaseRenew how
	// often it is renewed (below LeaseDuration).
	LeaseDuration, LeaseRenew time.Duration
	// NodeInventory writes the inventory annotation and the ready and
	// enforcement labels (the device plugin, whose pods the extender
	// places by them); false writes only the condition and the Lease.
	NodeInventory bool
	// Stopped is the registration written on the way out of Run.
	Stopped Registration
}

// Validate reports every required field that is empty.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct{ name, v string }{{"NodeName", c.NodeName}, {"ResourceName", c.ResourceName}, {"FieldManager", c.FieldManager}, {"HeartbeatNamespace", c.HeartbeatNamespace}} {
		if f.v == "" {
			errs = append(errs, fmt.Errorf("publish: %s is required", f.name))
		}
	}
	if c.LeaseRenew <= 0 || c.LeaseDuration <= c.LeaseRenew {
		errs = append(errs, fmt.Errorf("publish: LeaseRenew %v must be above 0 and below LeaseDuration %v", c.LeaseRenew, c.LeaseDuration))
	}
	return errors.Join(errs...)
}

// Publisher keeps the API server informed, in the background: the Node's
// condition (and, with Config.NodeInventory, its inventory annotation and
// labels), written only when they change, and the heartbeat Lease, renewed
// every LeaseRenew. It never blocks the agent; failures are retried with
// back-off. Only Run's goroutine uses its fields.
type Publisher struct {
	client API
	cfg    Config
	clock  clock.WithTicker
	src    Source

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

// New returns a Publisher of src's state; Run starts it.
func New(client API, cfg Config, src Source, clk clock.WithTicker) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Publisher{client: client, cfg: cfg, clock: clk, src: src}, nil
}

// Run publishes until ctx ends, then writes Config.Stopped once, so that
// the node reads not registered (the device plugin's ready label false)
// while the agent is gone.
func (p *Publisher) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("publisher")
	delay := RetryInitial
	failures := 0
	for {
		node, invChanged := p.src.Inventory()
		reg, regChanged := p.src.Registration()
		var wait time.Duration
		if err := p.reconcile(ctx, node, reg); err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			if failures == 1 || failures%10 == 0 {
				logger.Info("Publishing to the API server failed; retrying", "failures", failures, "retryIn", delay, "err", err.Error())
			}
			wait, delay = delay, min(2*delay, RetryMax)
		} else {
			if failures > 0 {
				logger.Info("Published to the API server", "afterFailures", failures)
			}
			failures, delay = 0, RetryInitial
			wait = max(0, p.cfg.LeaseRenew-p.clock.Since(p.leaseRenewed))
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
	// The agent stops: lift the scheduling barrier while we still can.
	final, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
	defer cancel()
	node, _ := p.src.Inventory()
	if err := p.reconcile(final, node, p.cfg.Stopped); err != nil {
		logger.Error(err, "Could not mark the node not ready on the way out")
	}
}

// reconcile makes the Node (labels, inventory, vgpu.ConditionRegistered)
// and the Lease match node and reg.
func (p *Publisher) reconcile(ctx context.Context, node vgpu.NodeInventory, reg Registration) error {
	inventory := ""
	if p.cfg.NodeInventory {
		var err error
		if inventory, err = vgpu.EncodeNodeInventory(node); err != nil {
			return fmt.Errorf("encode inventory: %w", err)
		}
	}
	ready := "false"
	if reg.Registered {
		ready = "true"
	}
	// After a renewal gap the extender may have turned the condition
	// Unknown meanwhile: read the Node again rather than trust the past.
	if !p.leaseRenewed.IsZero() && p.clock.Since(p.leaseRenewed) > p.cfg.LeaseDuration {
		p.nodeKnown = false
	}
	p.recheck = 0
	syncNode := func() error {
		err := p.syncNode(ctx, inventory, ready, string(node.Enforcement))
		if want, ok := p.src.Condition(reg, node); err == nil && ok {
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
// enforcement label (Config.NodeInventory) when they differ from what the
// Node holds. It reads the Node only when its state is unknown (start,
// after an error).
func (p *Publisher) syncNode(ctx context.Context, inventory, ready, enforcement string) error {
	if !p.nodeKnown {
		n, err := p.client.GetNode(ctx, p.cfg.NodeName)
		if err != nil {
			return fmt.Errorf("get node %s: %w", p.cfg.NodeName, err)
		}
		p.remember(n)
	}
	if !p.cfg.NodeInventory || (p.nodeInventory == inventory && p.nodeReady == ready && p.nodeEnforcement == enforcement) {
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
	n, err := p.client.PatchNode(ctx, p.cfg.NodeName, patch, metav1.PatchOptions{FieldManager: p.cfg.FieldManager})
	if err != nil {
		return fmt.Errorf("patch node %s: %w", p.cfg.NodeName, err)
	}
	p.remember(n)
	return nil
}

func (p *Publisher) remember(n *corev1.Node) {
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
func (p *Publisher) syncLease(ctx context.Context, reg Registration) error {
	name := vgpu.HeartbeatLeaseName(p.cfg.NodeName)
	ns := p.cfg.HeartbeatNamespace
	heartbeat, err := vgpu.EncodePluginHeartbeat(vgpu.PluginHeartbeat{
		Node:          p.cfg.NodeName,
		Mode:          p.cfg.Mode,
		PluginVersion: p.cfg.Version,
		ResourceName:  p.cfg.ResourceName,
		Registered:    reg.Registered,
		RegisteredAt:  reg.Since,
		Socket:        reg.Socket,
	})
	if err != nil {
		return fmt.Errorf("encode heartbeat: %w", err)
	}
	if p.lease == nil {
		l, err := p.client.GetLease(ctx, ns, name)
		switch {
		case apierrors.IsNotFound(err):
			l, err = p.client.CreateLease(ctx, p.newLease(name, heartbeat), metav1.CreateOptions{FieldManager: p.cfg.FieldManager})
			if err != nil {
				return fmt.Errorf("create lease %s/%s: %w", ns, name, err)
			}
			p.lease, p.leaseRenewed = l, p.clock.Now()
			return nil
		case err != nil:
			return fmt.Errorf("get lease %s/%s: %w", ns, name, err)
		}
		p.lease = l
	}
	if p.lease.Annotations[vgpu.AnnotationPluginHeartbeat] == heartbeat && p.lease.Labels[vgpu.LabelHeartbeat] == vgpu.LabelHeartbeatValue &&
		!p.leaseRenewed.IsZero() && p.clock.Since(p.leaseRenewed) < p.cfg.LeaseRenew {
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
	l.Spec.HolderIdentity = ptr.To(HolderIdentity(p.cfg.FieldManager, p.cfg.NodeName))
	l.Spec.LeaseDurationSeconds = ptr.To(p.leaseSeconds())
	if len(l.OwnerReferences) == 0 && p.nodeUID != "" {
		l.OwnerReferences = p.ownerReferences()
	}
	l, err = p.client.UpdateLease(ctx, l, metav1.UpdateOptions{FieldManager: p.cfg.FieldManager})
	if err != nil {
		return fmt.Errorf("renew lease %s/%s: %w", ns, name, err)
	}
	p.lease, p.leaseRenewed = l, p.clock.Now()
	return nil
}

func (p *Publisher) newLease(name, heartbeat string) *coordinationv1.Lease {
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
			HolderIdentity:       ptr.To(HolderIdentity(p.cfg.FieldManager, p.cfg.NodeName)),
			LeaseDurationSeconds: ptr.To(p.leaseSeconds()),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
}

// ownerReferences ties the Lease to its Node, so deleting the Node collects
// the Lease (as the kubelet's node leases are).
func (p *Publisher) ownerReferences() []metav1.OwnerReference {
	if p.nodeUID == "" {
		return nil
	}
	return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: p.cfg.NodeName, UID: p.nodeUID}}
}

// leaseSeconds is LeaseDuration in whole seconds, capped to the field's range.
func (p *Publisher) leaseSeconds() int32 {
	return int32(min(p.cfg.LeaseDuration/time.Second, math.MaxInt32)) //nolint:gosec // G115: capped above.
}

// HolderIdentity is the heartbeat Lease's holder: the agent's field manager
// and its node.
func HolderIdentity(fieldManager, node string) string { return fieldManager + "/" + node }

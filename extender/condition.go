package extender

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/extender/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// EventNodeCondition is the reason of the Node event the extender records
// when it changes a node's vgpu.ConditionRegistered.
const EventNodeCondition = "GPUSliceRegistrationLost"

// registrationVerdict is the condition the cluster side calls for.
type registrationVerdict struct {
	Status  corev1.ConditionStatus
	Reason  string
	Message string
}

// judgeRegistration says what a node's vgpu.ConditionRegistered should be
// by the cluster's evidence at now, and false when the condition may stay
// as it is. zeroSince is when allocatable was first seen 0 while the
// condition said True (zero: it is not 0). A stale heartbeat turns the
// condition Unknown, unless the plugin said it is not running (PluginStopped,
// DriverNotFound), which says more; an allocatable 0 for maxAge under a
// True condition turns it False. Pure.
func judgeRegistration(r cluster.Registration, now, zeroSince time.Time, maxAge time.Duration, heartbeatNamespace, resource string) (registrationVerdict, bool) {
	c := r.Condition
	lease := heartbeatNamespace + "/" + vgpu.HeartbeatLeaseName(r.Name)
	stale := !r.HasLease || r.RenewTime.IsZero() || now.Sub(r.RenewTime) > maxAge
	if stale && c.Status != corev1.ConditionUnknown && c.Reason != vgpu.ReasonPluginStopped && c.Reason != vgpu.ReasonDriverNotFound {
		agent := "device plugin"
		if r.DRA {
			agent = "DRA driver"
		}
		msg := fmt.Sprintf("the %s's heartbeat Lease %s is missing: it is not running or cannot reach the API server", agent, lease)
		if r.HasLease && !r.RenewTime.IsZero() {
			msg = fmt.Sprintf("the %s's heartbeat Lease %s was last renewed at %s, more than %s ago: it is not running or cannot reach the API server (it last reported %s)",
				agent, lease, r.RenewTime.UTC().Format(time.RFC3339), maxAge, c.Reason)
		}
		return registrationVerdict{corev1.ConditionUnknown, vgpu.ReasonHeartbeatStale, msg}, true
	}
	if !stale && !r.DRA && c.Status == corev1.ConditionTrue && r.Allocatable == 0 && !zeroSince.IsZero() && now.Sub(zeroSince) >= maxAge {
		return registrationVerdict{corev1.ConditionFalse, vgpu.ReasonNoAllocatableGPUs, fmt.Sprintf(
			"allocatable %s has been 0 for more than %s although the device plugin reported Registered: the kubelet lists none of its devices (kubelet restarted and the plugin has not registered again?)",
			resource, maxAge)}, true
	}
	return registrationVerdict{}, false
}

// conditionController turns vgpu.ConditionRegistered Unknown or False for
// nodes whose plugin cannot say so itself, as the node lifecycle
// controller does for Ready. Only the leader runs it (Scheduler.lead), a
// new one for each term. It is not safe for concurrent use:
// only its run goroutine calls pass.
type conditionController struct {
	s *Scheduler
	// zeroSince is when each node's allocatable was first seen 0 under a
	// True condition.
	zeroSince map[string]time.Time
	// written is the verdict last written per node, so that a pass
	// before the informer shows the write does not write it again.
	written map[string]registrationVerdict
}

func newConditionController(s *Scheduler) *conditionController {
	return &conditionController{s: s, zeroSince: map[string]time.Time{}, written: map[string]registrationVerdict{}}
}

// conditionInterval is how often the controller looks: a quarter of
// HeartbeatMaxAge, between 1 and 15 seconds.
func (s *Scheduler) conditionInterval() time.Duration {
	return min(max(s.cfg.HeartbeatMaxAge.Duration/4, time.Second), 15*time.Second)
}

// pass judges every node once and writes the conditions that change.
func (c *conditionController) pass(ctx context.Context) {
	logger := klog.FromContext(ctx)
	now := c.s.clock.Now()
	seen := map[string]bool{}
	for _, r := range c.s.state.Registrations() {
		seen[r.Name] = true
		if r.Condition.Status == corev1.ConditionTrue && r.Allocatable == 0 {
			if _, ok := c.zeroSince[r.Name]; !ok {
				c.zeroSince[r.Name] = now
			}
		} else {
			delete(c.zeroSince, r.Name)
		}
		v, change := judgeRegistration(r, now, c.zeroSince[r.Name], c.s.cfg.HeartbeatMaxAge.Duration, c.s.cfg.HeartbeatNamespace, c.s.cfg.ResourceName)
		if !change {
			delete(c.written, r.Name)
			continue
		}
		if w, ok := c.written[r.Name]; ok && w.Status == v.Status && w.Reason == v.Reason {
			continue
		}
		if err := c.write(ctx, r.Name, v, now); err != nil {
			logger.Error(err, "Could not set the node's registration condition", "node", r.Name, "reason", v.Reason)
			continue
		}
		c.written[r.Name] = v
		logger.Info("Set the node's registration condition", "node", r.Name, "status", v.Status, "reason", v.Reason, "was", r.Condition.Reason)
		c.s.events.Eventf(nodeRef(r.Name), corev1.EventTypeWarning, EventNodeCondition, "%s is now %s (%s): %s", vgpu.ConditionRegistered, v.Status, v.Reason, v.Message)
	}
	for name := range c.zeroSince {
		if !seen[name] {
			delete(c.zeroSince, name)
		}
	}
	for name := range c.written {
		if !seen[name] {
			delete(c.written, name)
		}
	}
}

// write patches the node's status with the verdict (a strategic merge
// patch: only this condition changes).
func (c *conditionController) write(ctx context.Context, node string, v registrationVerdict, now time.Time) error {
	t := metav1.NewTime(now)
	patch := fmt.Appendf(nil, `{"status":{"conditions":[{"type":%q,"status":%q,"reason":%q,"message":%q,"lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
		vgpu.ConditionRegistered, v.Status, v.Reason, v.Message, t.UTC().Format(time.RFC3339), t.UTC().Format(time.RFC3339))
	_, err := c.s.client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}, "status")
	if err != nil {
		return fmt.Errorf("patch node %s status: %w", node, err)
	}
	return nil
}

// run passes every conditionInterval until ctx ends.
func (c *conditionController) run(ctx context.Context) {
	wait.UntilWithContext(ctx, c.pass, c.s.conditionInterval())
}

// nodeRef is the reference the extender records node events on; the UID
// is the node's name, as the kubelet's, which kubectl describe node finds.
func nodeRef(name string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(name)}
}

var nodeUnregisteredDesc = prometheus.NewDesc(MetricNodeUnregistered,
	"1 for each node whose kubelet is Ready but whose device plugin is not registered: its "+string(vgpu.ConditionRegistered)+
		" condition is not True, or its heartbeat is older than heartbeatMaxAge (reason HeartbeatStale). Nodes that never ran the plugin have no series.",
	[]string{"node", "reason"}, nil)

// registrationCollector exports MetricNodeUnregistered from the informers'
// state at scrape time; every extender instance reports it.
type registrationCollector struct {
	s *Scheduler
}

// Describe implements prometheus.Collector.
func (c *registrationCollector) Describe(ch chan<- *prometheus.Desc) { ch <- nodeUnregisteredDesc }

// Collect implements prometheus.Collector.
func (c *registrationCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.s.clock.Now()
	for _, r := range c.s.state.Registrations() {
		if !r.KubeletReady {
			continue
		}
		reason := ""
		if r.Condition.Status != corev1.ConditionTrue {
			reason = r.Condition.Reason
		}
		if !r.HasLease || r.RenewTime.IsZero() || now.Sub(r.RenewTime) > c.s.cfg.HeartbeatMaxAge.Duration {
			reason = vgpu.ReasonHeartbeatStale
		}
		if reason != "" {
			ch <- prometheus.MustNewConstMetric(nodeUnregisteredDesc, prometheus.GaugeValue, 1, r.Name, reason)
		}
	}
}

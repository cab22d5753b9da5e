package inspect

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// unscheduledGrace is how long a new GPU pod may wait for its first
// scheduling attempt before doctor says no scheduler tried it.
const unscheduledGrace = time.Minute

// pendingChecks says, for each Pending GPU pod, why it waits: its
// scheduler's last word in plain words, or that no gpuslice scheduler has
// it. A scheduler error naming the extender is the extender check's FAIL.
func (s *Snapshot) pendingChecks() []Check {
	names := s.schedulerNames()
	var urls []string
	logs := "kubectl -n <namespace> logs deployment/<release>-scheduler -c extender"
	for i := range s.ConfigMaps {
		if sc, err := parseSchedulerConfig(&s.ConfigMaps[i]); err == nil {
			for _, e := range sc.file.Extenders {
				urls = append(urls, e.URLPrefix)
			}
			// The chart names the scheduler's ConfigMap after its Deployment.
			logs = fmt.Sprintf("kubectl -n %s logs deployment/%s -c extender", s.ConfigMaps[i].Namespace, s.ConfigMaps[i].Name)
		}
	}
	extender := s.extenderDeployed(len(urls) > 0)
	var checks []Check
	for i := range s.Pods {
		p := &s.Pods[i]
		if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" || !vgpu.AsksForGPU(p) {
			continue
		}
		key := p.Namespace + "/" + p.Name
		why := fmt.Sprintf("kubectl gpuslice why %s -n %s", p.Name, p.Namespace)
		c := Check{Name: "pending-pod", Result: Warn, Fix: why}
		age := s.Now.Sub(p.CreationTimestamp.Time).Round(time.Second)
		cond := podScheduled(p)
		switch {
		case !slices.Contains(names, p.Spec.SchedulerName):
			c.Result = Fail
			c.Message = fmt.Sprintf("pod %s has schedulerName %q, not %s: it reached the API server without the gpuslice webhook", key, p.Spec.SchedulerName, strings.Join(names, " or "))
			c.Fix = "recreate the pod once the webhook checks pass (or set spec.schedulerName yourself)"
		case cond == nil && age < unscheduledGrace:
			c.Result, c.Message = Pass, fmt.Sprintf("pod %s is waiting for its first scheduling attempt (%s old)", key, age)
			c.Fix = ""
		case cond == nil:
			c.Result = Fail
			c.Message = fmt.Sprintf("pod %s waited %s and no scheduler tried it: no kube-scheduler runs profile %s", key, age, p.Spec.SchedulerName)
			c.Fix = "see the scheduler-leader line"
		case cond.Reason == corev1.PodReasonSchedulerError:
			c.Result = Fail
			c.Message = fmt.Sprintf("pod %s: kube-scheduler failed: %s", key, cond.Message)
			if mentionsAny(cond.Message, urls) || strings.Contains(cond.Message, "extender") {
				extender.Result = Fail
				extender.Message = fmt.Sprintf("kube-scheduler cannot use the gpuslice extender (pod %s): %s", key, cond.Message)
				extender.Fix = "the extender container of the gpuslice scheduler pod is not serving: " + logs
			}
		default:
			c.Message = fmt.Sprintf("pod %s pending for %s: %s", key, age, plainWords(cond.Message))
		}
		checks = append(checks, c)
	}
	return append([]Check{extender}, checks...)
}

func mentionsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if sub != "" && strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// podScheduled returns p's PodScheduled condition when it is False: the
// scheduler's last verdict.
func podScheduled(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if c := &p.Status.Conditions[i]; c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c
		}
	}
	return nil
}

// plainWords shortens kube-scheduler's verdict to the nodes' reasons: it
// drops the preemption part, which repeats them, and explains the
// extender's "plugin not ready" prefix.
func plainWords(msg string) string {
	if i := strings.Index(msg, " preemption:"); i >= 0 {
		msg = strings.TrimSpace(msg[:i])
	}
	msg = strings.TrimSuffix(msg, ".")
	if strings.Contains(msg, "plugin not ready") {
		msg += " (\"plugin not ready\": the device plugin is not serving those nodes; see their node checks)"
	}
	return msg
}

// extenderContainer is the name of the extender's container in the chart's
// scheduler Deployment.
const extenderContainer = "extender"

// extenderDeployed is the extender check before the pending pods speak:
// a FAIL when a scheduler profile calls an extender (configured) but no
// gpuslice Deployment runs one.
func (s *Snapshot) extenderDeployed(configured bool) Check {
	for _, d := range s.Deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == extenderContainer {
				return Check{Name: "extender", Result: Pass, Message: fmt.Sprintf("Deployment %s/%s runs the extender; no pending GPU pod reports an extender error", d.Namespace, d.Name)}
			}
		}
	}
	if configured {
		return Check{Name: "extender", Result: Fail,
			Message: "the gpuslice scheduler profile calls an extender, but no gpuslice Deployment has an extender container",
			Fix:     "reinstall the chart (helm upgrade --install) so its scheduler Deployment comes back"}
	}
	return Check{Name: "extender", Result: Pass, Message: "no pending GPU pod reports an extender error"}
}

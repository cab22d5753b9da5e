package inspect

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// nodeChecks is the registration checklist of one node, in the order a
// plugin registers: its pod, the kubelet's view, then what it published.
func (s *Snapshot) nodeChecks(n *corev1.Node) []Check {
	pod := s.pluginPod(n.Name)
	lease, hasLease := s.Leases[n.Name]
	hb := s.checkHeartbeat(n, lease, hasLease, pod, "device plugin")
	podCheck := s.checkPluginPod(n, pod)
	if pod == nil && hb.fresh && hb.heartbeat != nil && hb.heartbeat.Registered {
		podCheck.Result = Warn
		podCheck.Message += ", but a registered device plugin renews its heartbeat: it runs outside a pod of the chart"
	}
	checks := []Check{podCheck}
	if pod != nil {
		checks = append(checks, checkPluginReady(pod))
	}
	cond := checkCondition(n, "device plugin")
	checks = append(checks, cond, s.checkAllocatable(n, pod), checkReadyLabel(n, pod), hb.Check, checkInventory(n), s.checkKubeletSocket(n, hb, pod))
	return checks
}

func (s *Snapshot) checkPluginPod(n *corev1.Node, pod *corev1.Pod) Check {
	c := Check{Name: "plugin-pod"}
	if pod != nil {
		c.Result, c.Message = Pass, fmt.Sprintf("pod %s/%s (%s)", pod.Namespace, pod.Name, pod.Status.Phase)
		return c
	}
	c.Result, c.Message = Fail, "no gpuslice device-plugin pod on this node"
	if len(s.DaemonSets) == 0 {
		c.Fix = "no gpuslice DaemonSet found: install the chart (helm install gpuslice charts/gpuslice -n gpuslice-system --create-namespace)"
		return c
	}
	var why []string
	for _, ds := range s.DaemonSets {
		if ds.Labels[LabelComponent] != ComponentDevicePlugin {
			continue
		}
		var missing []string
		for k, v := range ds.Spec.Template.Spec.NodeSelector {
			if n.Labels[k] != v {
				missing = append(missing, k+"="+v)
			}
		}
		slices.Sort(missing)
		if len(missing) > 0 {
			why = append(why, fmt.Sprintf("DaemonSet %s/%s needs label %s", ds.Namespace, ds.Name, strings.Join(missing, ",")))
		} else {
			why = append(why, fmt.Sprintf("DaemonSet %s/%s selects the node but has no pod here (taints? kubectl -n %s describe ds %s)", ds.Namespace, ds.Name, ds.Namespace, ds.Name))
		}
	}
	c.Fix = strings.Join(why, "; ") + "; label the node (kubectl label node " + n.Name + " ...) or set devicePlugin.nodeSelector"
	return c
}

func checkPluginReady(pod *corev1.Pod) Check {
	c := Check{Name: "plugin-ready"}
	ready := false
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
			ready = true
		}
	}
	var restarts int32
	var last, waiting string
	for _, cs := range pod.Status.ContainerStatuses {
		restarts += cs.RestartCount
		if t := cs.LastTerminationState.Terminated; t != nil {
			last = fmt.Sprintf("; last exit %s (code %d) at %s", t.Reason, t.ExitCode, t.FinishedAt.UTC().Format(time.RFC3339))
			if t.Reason == "OOMKilled" {
				waiting = "OOMKilled"
			}
		}
		if w := cs.State.Waiting; w != nil && waiting == "" {
			waiting = w.Reason
		}
	}
	logs := fmt.Sprintf("kubectl -n %s logs %s --previous", pod.Namespace, pod.Name)
	switch {
	case !ready:
		c.Result, c.Message = Fail, fmt.Sprintf("pod not Ready (%s%s), %d restarts%s", pod.Status.Phase, prefixed(", ", waiting), restarts, last)
		c.Fix = "the plugin's readiness is its registration with the kubelet; read why it is not: " + logs
	case restarts > 0:
		c.Result, c.Message = Warn, fmt.Sprintf("Ready, %d restarts%s", restarts, last)
		c.Fix = "read the last run's log: " + logs
	default:
		c.Result, c.Message = Pass, "Ready, 0 restarts"
	}
	if waiting == "OOMKilled" {
		c.Fix = "the plugin ran out of memory: raise devicePlugin.resources.limits.memory; " + c.Fix
	}
	return c
}

func prefixed(sep, s string) string {
	if s == "" {
		return ""
	}
	return sep + s
}

// registrationFixes is what to do about each reason of a False condition.
var registrationFixes = map[string]string{
	vgpu.ReasonKubeletSocketMissing: "the plugin watches a folder without the kubelet's kubelet.sock: set devicePlugin.kubeletRootDir to the kubelet's --root-dir (default /var/lib/kubelet)",
	vgpu.ReasonRegisterFailed:       "the kubelet refused the registration (the message has its error): read the kubelet's log on the node and check that no other plugin registers hami.io/gpu",
	vgpu.ReasonNoHealthyGPUs:        "every GPU is unhealthy: see the node's events for the XID, then reset the GPU or drain and reboot the node",
	vgpu.ReasonDriverNotFound:       "NVML did not load: install the NVIDIA driver and container toolkit on the node and run the plugin with the nvidia runtime",
	vgpu.ReasonPluginStopped:        "the device plugin stopped: check that its DaemonSet schedules a pod on this node and that the pod is Running (lines below)",
	vgpu.ReasonHeartbeatStale:       "the plugin stopped renewing its heartbeat Lease: it is dead or cannot reach the API server; see the plugin pod's state and log (lines below)",
	vgpu.ReasonNoAllocatableGPUs:    "the plugin says registered but the kubelet reports no allocatable hami.io/gpu: restart the plugin pod, and read the kubelet's log for the device manager's errors",
}

// checkCondition judges n's vgpu.ConditionRegistered, which agent ("device plugin", "DRA
// driver") writes.
func checkCondition(n *corev1.Node, agent string) Check {
	c := Check{Name: "condition"}
	for _, cond := range n.Status.Conditions {
		if cond.Type != vgpu.ConditionRegistered {
			continue
		}
		msg := fmt.Sprintf("%s=%s (%s): %s", vgpu.ConditionRegistered, cond.Status, cond.Reason, cond.Message)
		switch cond.Status {
		case corev1.ConditionTrue:
			c.Result, c.Message = Pass, msg
		default:
			c.Result, c.Message = Fail, msg
			c.Fix = registrationFixes[cond.Reason]
			if c.Fix == "" {
				c.Fix = "the " + agent + " is not registered; see its log and the lines below"
			}
		}
		return c
	}
	c.Result, c.Message = Warn, fmt.Sprintf("no %s condition on the node", vgpu.ConditionRegistered)
	c.Fix = "the " + agent + " here does not publish it (an older version, or it never ran); the lines below tell its state"
	return c
}

// restartFix says how to restart the plugin of node.
func restartFix(pod *corev1.Pod, node string) string {
	if pod == nil {
		return "start the device plugin on " + node
	}
	return fmt.Sprintf("restart the plugin (kubectl -n %s delete pod %s) and read its log (kubectl -n %s logs %s)", pod.Namespace, pod.Name, pod.Namespace, pod.Name)
}

func (s *Snapshot) checkAllocatable(n *corev1.Node, pod *corev1.Pod) Check {
	c := Check{Name: "allocatable"}
	var renewed *metav1.MicroTime
	if l, ok := s.Leases[n.Name]; ok {
		renewed = l.Spec.RenewTime
	}
	capQ, hasCap := n.Status.Capacity[vgpu.ResourceGPU]
	allocQ := n.Status.Allocatable[vgpu.ResourceGPU]
	capacity, alloc := capQ.Value(), allocQ.Value()
	switch {
	case !hasCap || capacity == 0:
		c.Result, c.Message = Fail, fmt.Sprintf("no %s capacity: the device plugin has not registered with this node's kubelet", vgpu.ResourceGPU)
		c.Fix = "see the kubelet-socket and heartbeat lines; " + restartFix(pod, n.Name)
	case alloc == 0:
		c.Result = Fail
		c.Message = fmt.Sprintf("%s capacity %d but allocatable 0: the kubelet lost the device plugin's endpoint (it keeps the capacity for %s after the plugin stops, then drops it)", vgpu.ResourceGPU, capacity, devicePluginGracePeriod)
		if renewed != nil {
			c.Message += fmt.Sprintf("; the plugin's heartbeat was last renewed %s ago", s.Now.Sub(renewed.Time).Round(time.Second))
		}
		c.Fix = "the plugin is not serving: " + restartFix(pod, n.Name)
	case alloc < capacity:
		c.Result, c.Message = Warn, fmt.Sprintf("%s allocatable %d of capacity %d: %d devices unhealthy", vgpu.ResourceGPU, alloc, capacity, capacity-alloc)
		c.Fix = "a GPU is unhealthy: see kubectl describe node " + n.Name + " for the XID"
	default:
		c.Result, c.Message = Pass, fmt.Sprintf("%s capacity %d = allocatable %d", vgpu.ResourceGPU, capacity, alloc)
	}
	return c
}

func checkReadyLabel(n *corev1.Node, pod *corev1.Pod) Check {
	c := Check{Name: "ready-label"}
	v, ok := n.Labels[vgpu.LabelGPUReady]
	ready, err := vgpu.ParseReadyLabel(v)
	switch {
	case !ok:
		c.Result, c.Message = Fail, fmt.Sprintf("label %s is missing: gpuslice places no GPU pod on this node", vgpu.LabelGPUReady)
	case err != nil:
		c.Result, c.Message = Fail, err.Error()
	case !ready:
		c.Result, c.Message = Fail, fmt.Sprintf("label %s=false: the plugin lost its registration or stopped; gpuslice places no GPU pod here", vgpu.LabelGPUReady)
	default:
		c.Result, c.Message = Pass, vgpu.LabelGPUReady+"=true"
		return c
	}
	c.Fix = "the plugin sets the label when it registers and rewrites it on start: " + restartFix(pod, n.Name)
	return c
}

// heartbeatCheck is the heartbeat check and what it read, for the
// kubelet-socket check.
type heartbeatCheck struct {
	Check
	heartbeat *vgpu.PluginHeartbeat // nil when missing or malformed
	fresh     bool
}

// checkHeartbeat judges n's heartbeat Lease l (ok: it exists), written by agent ("device
// plugin", "DRA driver").
func (s *Snapshot) checkHeartbeat(n *corev1.Node, l coordinationv1.Lease, ok bool, pod *corev1.Pod, agent string) heartbeatCheck {
	c := heartbeatCheck{Check: Check{Name: "heartbeat"}}
	restart := func() string {
		if pod == nil && agent != "device plugin" {
			return "restart the " + agent + "'s pod on " + n.Name + " and read its log"
		}
		return restartFix(pod, n.Name)
	}
	where := s.HeartbeatNamespace + "/" + vgpu.HeartbeatLeaseName(n.Name)
	if !ok {
		c.Result, c.Message = Fail, "no heartbeat Lease "+where+": the "+agent+" never reached the API server"
		c.Fix = "read the " + agent + "'s log; it needs create/update on leases in " + s.HeartbeatNamespace + " (the chart's RBAC)"
		return c
	}
	if raw, has := l.Annotations[vgpu.AnnotationPluginHeartbeat]; has {
		if h, err := vgpu.ParsePluginHeartbeat(raw); err == nil {
			c.heartbeat = &h
		} else {
			c.Result, c.Message = Fail, fmt.Sprintf("Lease %s: %v", where, err)
			c.Fix = "a plugin of another version or a hand edit wrote it: " + restart()
			return c
		}
	}
	if l.Spec.RenewTime == nil {
		c.Result, c.Message = Fail, "Lease "+where+" has no renewTime: the plugin has not renewed it"
		c.Fix = restart()
		return c
	}
	duration := defaultLeaseDuration
	if d := l.Spec.LeaseDurationSeconds; d != nil {
		duration = time.Duration(*d) * time.Second
	}
	age := s.Now.Sub(l.Spec.RenewTime.Time).Round(time.Second)
	version := ""
	if c.heartbeat != nil && c.heartbeat.PluginVersion != "" {
		version = ", plugin " + c.heartbeat.PluginVersion
	}
	if age > duration {
		c.Result = Fail
		c.Message = fmt.Sprintf("Lease %s renewed %s ago, longer than its %s duration: the %s is not running or cannot reach the API server", where, age, duration, agent)
		c.Fix = "the scheduler extender turns the node away meanwhile; " + restart()
		return c
	}
	c.fresh = true
	c.Result, c.Message = Pass, fmt.Sprintf("Lease %s renewed %s ago (duration %s%s)", where, max(age, 0), duration, version)
	return c
}

func checkInventory(n *corev1.Node) Check {
	c := Check{Name: "inventory"}
	inv, err := inventoryOf(n)
	if err != nil {
		c.Result, c.Message = Fail, err.Error()
		c.Fix = "the device plugin writes it once it has read its GPUs: read the plugin's log"
		if errors.Is(err, vgpu.ErrNoInventory) {
			c.Message += ": the device plugin has not published this node's GPUs"
		} else {
			c.Fix = "a plugin of another version or a hand edit wrote it; restart the plugin so it writes its own"
		}
		return c
	}
	allocQ := n.Status.Allocatable[vgpu.ResourceGPU]
	want := int64(inv.Healthy() * inv.SplitCount)
	msg := fmt.Sprintf("%s (%s), %d healthy × %d slices = %d devices", count(len(inv.GPUs), "GPU"), models(inv), inv.Healthy(), inv.SplitCount, want)
	switch alloc := allocQ.Value(); {
	case alloc == 0:
		c.Result, c.Message = Pass, msg
	case alloc != want:
		c.Result, c.Message = Warn, fmt.Sprintf("%s, but allocatable %s is %d", msg, vgpu.ResourceGPU, alloc)
		c.Fix = "the kubelet and the plugin disagree; it settles within seconds after a health change, else restart the plugin"
	default:
		c.Result, c.Message = Pass, msg+" = allocatable"
	}
	return c
}

// count is "1 GPU" or "n GPUs".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// models is the inventory's models with their counts: "2× A100, 1× T4".
func models(inv vgpu.NodeInventory) string {
	var names []string
	per := map[string]int{}
	for _, g := range inv.GPUs {
		if per[g.Model] == 0 {
			names = append(names, g.Model)
		}
		per[g.Model]++
	}
	parts := make([]string, 0, len(names))
	for _, m := range names {
		parts = append(parts, fmt.Sprintf("%d× %s", per[m], m))
	}
	return strings.Join(parts, ", ")
}

// devicePluginVolume is the name of the chart's hostPath volume of the
// kubelet's device-plugin folder.
const devicePluginVolume = "device-plugins"

func (s *Snapshot) checkKubeletSocket(n *corev1.Node, hb heartbeatCheck, pod *corev1.Pod) Check {
	c := Check{Name: "kubelet-socket"}
	folder := "/var/lib/kubelet/device-plugins"
	if pod != nil {
		for _, v := range pod.Spec.Volumes {
			if v.Name == devicePluginVolume && v.HostPath != nil {
				folder = v.HostPath.Path
			}
		}
	}
	h := hb.heartbeat
	switch {
	case h == nil || !hb.fresh:
		c.Result, c.Message = Warn, "unknown: no fresh heartbeat tells the plugin's registration (see heartbeat)"
		return c
	case h.Registered:
		c.Result, c.Message = Pass, fmt.Sprintf("registered with the kubelet as %s since %s", h.Socket, h.RegisteredAt.Format(time.RFC3339))
		return c
	}
	c.Result = Fail
	c.Message = "the device plugin runs but is not registered with the kubelet: kubelet.sock is missing from the device-plugin folder it watches, or the kubelet refused it"
	for _, cond := range n.Status.Conditions {
		if cond.Type == vgpu.ConditionRegistered && cond.Status != corev1.ConditionTrue {
			c.Message = fmt.Sprintf("the device plugin is not registered with the kubelet: %s: %s", cond.Reason, cond.Message)
		}
	}
	c.Fix = fmt.Sprintf("the plugin must watch the folder where the kubelet keeps kubelet.sock (<kubelet --root-dir>/device-plugins; the plugin pod mounts %s): set devicePlugin.kubeletRootDir to the kubelet's --root-dir", folder)
	return c
}

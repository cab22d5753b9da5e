package extender

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/extender/retry"
)

// Metric names of the pods Filter turned away from every node.
const (
	MetricPendingPods         = "gpuslice_extender_pending_pods"
	MetricPendingOldestSecond = "gpuslice_extender_pending_pod_oldest_seconds"
)

// Values of the reason label of MetricPendingPods: what keeps the pod
// from every node it was filtered against, the most hopeful first.
const (
	// PendingNoRoom: some node has the GPUs the pod asks for, but its
	// slices, memory, cores or NUMA room are taken.
	PendingNoRoom = "NoRoom"
	// PendingNoMatchingGPU: no node has enough healthy GPUs of the wanted
	// model or UUID.
	PendingNoMatchingGPU = "NoMatchingGPU"
	// PendingPluginNotReady: the device plugin serves none of the nodes
	// (or the extender did not know them yet).
	PendingPluginNotReady = "PluginNotReady"
)

// pendingReasons labels the waiting pods by the most hopeful class of what
// turned them away (retry.Tracker.Pending).
var pendingReasons = [retry.Classes]string{
	retry.ClassCapacity:  PendingNoRoom,
	retry.ClassInventory: PendingNoMatchingGPU,
	retry.ClassNotReady:  PendingPluginNotReady,
}

var (
	pendingPodsDesc = prometheus.NewDesc(MetricPendingPods,
		"GPU pods the latest Filter turned away from every node it was sent, until they are bound or deleted, by reason: NoRoom, NoMatchingGPU, PluginNotReady.",
		[]string{"reason"}, nil)
	pendingOldestDesc = prometheus.NewDesc(MetricPendingOldestSecond,
		"Seconds since Filter first turned away the longest-waiting of those pods, by reason; 0 when none waits.",
		[]string{"reason"}, nil)
)

// pendingCollector exports the waiting pods at scrape time.
type pendingCollector struct {
	s *Scheduler
}

// Describe implements prometheus.Collector.
func (c *pendingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pendingPodsDesc
	ch <- pendingOldestDesc
}

// Collect implements prometheus.Collector.
func (c *pendingCollector) Collect(ch chan<- prometheus.Metric) {
	figures := c.s.retries.Pending(c.s.clock.Now())
	for class, reason := range pendingReasons {
		f := figures[class]
		ch <- prometheus.MustNewConstMetric(pendingPodsDesc, prometheus.GaugeValue, float64(f.Count), reason)
		ch <- prometheus.MustNewConstMetric(pendingOldestDesc, prometheus.GaugeValue, f.Oldest.Seconds(), reason)
	}
}

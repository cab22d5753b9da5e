package extender

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

var pendingReasons = []string{PendingNoRoom, PendingNoMatchingGPU, PendingPluginNotReady}

var (
	pendingPodsDesc = prometheus.NewDesc(MetricPendingPods,
		"GPU pods the latest Filter turned away from every node it was sent, until they are bound or deleted, by reason: NoRoom, NoMatchingGPU, PluginNotReady.",
		[]string{"reason"}, nil)
	pendingOldestDesc = prometheus.NewDesc(MetricPendingOldestSecond,
		"Seconds since Filter first turned away the longest-waiting of those pods, by reason; 0 when none waits.",
		[]string{"reason"}, nil)
)

// pendingReason is the label of a waiting pod's rejection.
func pendingReason(rej rejection) string {
	switch {
	case len(rej.nodes[classCapacity]) > 0:
		return PendingNoRoom
	case len(rej.nodes[classInventory]) > 0:
		return PendingNoMatchingGPU
	}
	return PendingPluginNotReady
}

// pendingFigures are the count and oldest wait of one reason.
type pendingFigures struct {
	count  int
	oldest time.Duration
}

// pending returns, per reason, the waiting pods and the longest wait at now.
func (r *retries) pending(now time.Time) map[string]pendingFigures {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]pendingFigures{}
	for _, w := range r.waiting {
		reason := pendingReason(w.rej)
		f := out[reason]
		f.count++
		if !w.since.IsZero() {
			f.oldest = max(f.oldest, now.Sub(w.since))
		}
		out[reason] = f
	}
	return out
}

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
	figures := c.s.state.retries.pending(c.s.clock.Now())
	for _, reason := range pendingReasons {
		f := figures[reason]
		ch <- prometheus.MustNewConstMetric(pendingPodsDesc, prometheus.GaugeValue, float64(f.count), reason)
		ch <- prometheus.MustNewConstMetric(pendingOldestDesc, prometheus.GaugeValue, f.oldest.Seconds(), reason)
	}
}

package scale

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/test/cluster"
)

// leaseResource is the resource of heartbeat renewals in API counts.
const leaseResource = "leases"

// WriteResult writes r's detail: both phases, the extender's latencies, the API requests per
// bound pod, the processes' memory, the heartbeats and the correctness check.
func WriteResult(w io.Writer, r BenchResult) {
	fmt.Fprintf(w, "\n== %d hollow nodes, %d GPUs (%s); N = %d pods per phase", r.Nodes, r.GPUs, r.Models, r.Pods)
	if r.Background > 0 {
		fmt.Fprintf(w, ", %d bound background pods throughout", r.Background)
	}
	fmt.Fprintln(w, " ==")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tprofile\tbound\tunschedulable\tcreate\telapsed\tpods/s\tAPI req/pod\twithout leases\ttop API requests per bound pod")
	for _, p := range []struct {
		res     PhaseResult
		profile string
	}{{r.Plain, corev1.DefaultSchedulerName}, {r.GPU, cluster.SchedulerName}} {
		elapsed := p.res.Elapsed.Round(10 * time.Millisecond).String()
		if p.res.TimedOut {
			elapsed += " (deadline)"
		}
		per := func(v float64) float64 {
			if p.res.Bound == 0 {
				return 0
			}
			return v / float64(p.res.Bound)
		}
		var top []string
		for _, k := range p.res.API.Top(5) {
			top = append(top, fmt.Sprintf("%s %.2f", k, per(p.res.API[k])))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d\t%v\t%s\t%.1f\t%.2f\t%.2f\t%s\n", p.res.Name, p.profile, p.res.Bound, p.res.Pods, p.res.Unschedulable,
			p.res.CreateTime.Round(10*time.Millisecond), elapsed, p.res.PodsPerSecond(), per(p.res.API.Total()), per(p.res.API.Without(leaseResource)), strings.Join(top, ", "))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "GPU/plain pods/s: %.3f\n", r.Ratio())
	fmt.Fprint(w, "extender, GPU phase:")
	for _, verb := range []string{"filter", "prioritize", "bind"} {
		h := r.GPU.ExtenderDurations[verb]
		fmt.Fprintf(w, " %s n=%.0f p50 %s p99 %s;", verb, h.count(), formatSeconds(h.quantile(0.5)), formatSeconds(h.quantile(0.99)))
	}
	fmt.Fprintf(w, " binds %s %.0f, %s %.0f, %s %.0f\n", extender.BindSuccess, r.GPU.Binds[extender.BindSuccess],
		extender.BindUnfit, r.GPU.Binds[extender.BindUnfit], extender.BindError, r.GPU.Binds[extender.BindError])
	fmt.Fprint(w, "CPU per bound pod, plain | GPU phase:")
	for _, name := range controlPlane() {
		if _, ok := r.GPU.CPU[name]; ok {
			fmt.Fprintf(w, " %s %s | %s;", name, formatMillis(r.Plain.CPUPerBound(name)), formatMillis(r.GPU.CPUPerBound(name)))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "memory after the GPU phase (RSS/peak, RSS of anonymous pages + mapped files):")
	for _, name := range controlPlane() {
		if m, ok := r.GPU.Memory[name]; ok {
			fmt.Fprintf(w, " %s %s/%s (%s + %s);", name, mib(m.RSSKiB), mib(m.PeakKiB), mib(m.AnonKiB), mib(m.FileKiB))
		}
	}
	fmt.Fprintf(w, " extender Go heap in use %.0f MiB\n", r.GPU.ExtenderHeapMiB)
	if g := r.GPU.ExtenderGoMiB; len(g) > 0 {
		fmt.Fprintf(w, "extender Go memory: heap in use %.0f MiB, heap idle not returned to the OS %.0f MiB, stacks %.0f MiB, the runtime's own (collector, spans, other) %.0f MiB, obtained from the OS %.0f MiB (%.0f MiB of it returned), next collection at a heap of %.0f MiB\n",
			r.GPU.ExtenderHeapMiB, g[metricHeapIdle]-g[metricHeapReleased], g[metricStackInuse], g[metricGCSys]+g[metricMSpanSys]+g[metricOtherSys], g[metricSys], g[metricHeapReleased], g[metricNextGC])
	}
	fmt.Fprintf(w, "heartbeat renewals: %d sent, %d failed", r.HeartbeatRenewals, r.HeartbeatFailures)
	if r.HeartbeatError != "" {
		fmt.Fprintf(w, " (last: %s)", r.HeartbeatError)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "correctness: %d bound GPU pods checked on %d nodes, %d violations\n", r.Check.Pods, len(r.Check.Use), len(r.Check.Violations))
	if k := r.Wake; k != nil {
		fmt.Fprintf(w, "targeted retries, room: %d pods wait for room on one full node; a GPU freed on another node: %.0f retries, %.0f pod writes; a GPU freed on theirs: %.0f retries, %.0f pod writes, %d bound (kube-scheduler sees a pod deleted and retries them itself)\n",
			k.Waiters, k.ElsewhereRetries, k.ElsewherePatches, k.Retries, k.Patches, k.Bound)
	}
	if k := r.WakeHeartbeat; k != nil {
		fmt.Fprintf(w, "targeted retries, heartbeat: %d pods wait for one node's stale heartbeat; another node's heartbeat back: %.0f retries, %.0f pod writes; theirs back: %.0f retries, %.0f pod writes (%.2f per woken pod), %d bound\n",
			k.Waiters, k.ElsewhereRetries, k.ElsewherePatches, k.Retries, k.Patches, k.WritesPerWoken(), k.Bound)
	}
	for i, v := range r.Check.Violations {
		if i == 10 {
			fmt.Fprintf(w, "  … %d more\n", len(r.Check.Violations)-i)
			break
		}
		fmt.Fprintf(w, "  %v\n", v)
	}
}

// WriteSummary writes one row per result: the figures issue-level targets are stated in.
func WriteSummary(w io.Writer, results []BenchResult) {
	fmt.Fprintln(w, "\n== summary ==")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\tGPUs\tN\tplain pods/s\tGPU pods/s\tratio\tGPU bound\tfilter p50/p99\tprioritize p50/p99\tbind p50/p99\tAPI req/GPU pod\textender RSS\tkube-scheduler RSS\tviolations\t")
	for _, r := range results {
		q := func(verb string) string {
			h := r.GPU.ExtenderDurations[verb]
			return formatSeconds(h.quantile(0.5)) + "/" + formatSeconds(h.quantile(0.99))
		}
		perPod := 0.0
		if r.GPU.Bound > 0 {
			perPod = r.GPU.API.Without(leaseResource) / float64(r.GPU.Bound)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.1f\t%.1f\t%.3f\t%d/%d\t%s\t%s\t%s\t%.2f\t%s\t%s\t%d\t\n", r.Nodes, r.GPUs, r.Pods,
			r.Plain.PodsPerSecond(), r.GPU.PodsPerSecond(), r.Ratio(), r.GPU.Bound, r.GPU.Pods, q("filter"), q("prioritize"), q("bind"), perPod,
			mib(r.GPU.Memory[cluster.ExtenderName].RSSKiB), mib(r.GPU.Memory["kube-scheduler"].RSSKiB), len(r.Check.Violations))
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "API req/GPU pod leaves out the heartbeat Lease renewals and counts every request of the phase (creates of pods not bound by a deadline too); RSS is after the GPU phase.")
}

// formatMillis renders d in milliseconds with two decimals.
func formatMillis(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// mib renders KiB as MiB.
func mib(kib int64) string { return fmt.Sprintf("%.0f MiB", float64(kib)/1024) }

// sortByCount orders keys by count, most first, then by name.
func sortByCount(keys []string, count map[string]int) {
	sort.Slice(keys, func(i, j int) bool {
		if count[keys[i]] != count[keys[j]] {
			return count[keys[i]] > count[keys[j]]
		}
		return keys[i] < keys[j]
	})
}

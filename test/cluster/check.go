package cluster

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/test/fakecri"
	"github.com/gpuslice/gpuslice/vgpu"
)

// RecordKey is the key of a container's records in LatestRecords: pod UID, "/", container name.
func RecordKey(podUID types.UID, container string) string { return string(podUID) + "/" + container }

// LatestRecords returns, by RecordKey, the latest CreateContainer record of every node.
func (c *Cluster) LatestRecords() (map[string]fakecri.Record, error) {
	out := map[string]fakecri.Record{}
	for _, n := range c.Nodes {
		records, err := n.CRIRecords()
		if err != nil {
			return nil, err
		}
		for _, r := range records {
			out[RecordKey(types.UID(r.PodUID), r.Container)] = r
		}
	}
	return out, nil
}

// AllocationMismatches compares the environment each container of the running pod p got at
// CreateContainer (its latest record in records, by RecordKey), as the runtime resolved it, with
// the pod's own allocation annotation, and returns one line per mismatch, naming the pod.
func AllocationMismatches(p *corev1.Pod, records map[string]fakecri.Record) []string {
	alloc, err := vgpu.ParsePodAllocation(p.Annotations[vgpu.AnnotationPodAllocation])
	if err != nil {
		return []string{fmt.Sprintf("%s: allocation annotation: %v", p.Name, err)}
	}
	var bad []string
	if alloc.Node != p.Spec.NodeName {
		bad = append(bad, fmt.Sprintf("%s: allocation for node %q, bound to %q", p.Name, alloc.Node, p.Spec.NodeName))
	}
	for _, ca := range alloc.Containers {
		r, ok := records[RecordKey(p.UID, ca.Name)]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s/%s: no CreateContainer record", p.Name, ca.Name))
			continue
		}
		bad = append(bad, EnvMismatches(p, ca, r.Env)...)
	}
	return bad
}

// EnvMismatches compares env, the environment a container got, with what container ca of pod p
// must see: the pod's identity, exactly the GPUs of its allocation and their memory limits. It
// returns one line per difference.
func EnvMismatches(p *corev1.Pod, ca vgpu.ContainerAllocation, env map[string]string) []string {
	uuids := make([]string, len(ca.GPUs))
	for i, s := range ca.GPUs {
		uuids[i] = s.UUID
	}
	want := map[string]string{
		"GPUSLICE_POD_UID":       string(p.UID),
		"GPUSLICE_POD":           p.Namespace + "/" + p.Name,
		"GPUSLICE_CONTAINER":     ca.Name,
		"NVIDIA_VISIBLE_DEVICES": strings.Join(uuids, ","),
	}
	for i, s := range ca.GPUs {
		want["CUDA_DEVICE_MEMORY_LIMIT_"+strconv.Itoa(i)] = strconv.FormatInt(s.MemoryMiB, 10) + "m"
	}
	var bad []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if env[k] != want[k] {
			bad = append(bad, fmt.Sprintf("%s/%s: %s=%q, want %q", p.Name, ca.Name, k, env[k], want[k]))
		}
	}
	if _, extra := env["CUDA_DEVICE_MEMORY_LIMIT_"+strconv.Itoa(len(ca.GPUs))]; extra {
		bad = append(bad, fmt.Sprintf("%s/%s: a memory limit for GPU %d, which it was not granted", p.Name, ca.Name, len(ca.GPUs)))
	}
	return bad
}

// CapacityViolations sums the allocations of pods (those that hold GPUs: bound, not finished) per
// GPU and returns one line per GPU whose slices exceed its schedulable memory, its split count or
// its compute, naming the GPU and the pods on it. Pods without a readable allocation are skipped
// (AllocationMismatches reports them).
func (c *Cluster) CapacityViolations(ctx context.Context, pods []corev1.Pod) ([]string, error) {
	type use struct {
		memMiB int64
		slices int
		cores  int
		pods   []string
	}
	used := map[string]*use{}
	for _, p := range pods {
		alloc, err := vgpu.ParsePodAllocation(p.Annotations[vgpu.AnnotationPodAllocation])
		if err != nil {
			continue
		}
		for _, ca := range alloc.Containers {
			for _, s := range ca.GPUs {
				u := used[s.UUID]
				if u == nil {
					u = &use{}
					used[s.UUID] = u
				}
				u.memMiB += s.MemoryMiB
				u.slices++
				u.cores += s.CoresPercent
				u.pods = append(u.pods, fmt.Sprintf("%s/%s(%dMiB,%d%%)", p.Name, ca.Name, s.MemoryMiB, s.CoresPercent))
			}
		}
	}
	var bad []string
	for _, n := range c.Nodes {
		_, inv, err := c.NodeInventory(ctx, n.Name)
		if err != nil {
			return nil, err
		}
		for _, g := range inv.GPUs {
			u := used[g.UUID]
			if u == nil {
				continue
			}
			if u.memMiB > g.SchedulableMemoryMiB || u.slices > inv.SplitCount || u.cores > g.CoresPercent {
				bad = append(bad, fmt.Sprintf("%s %s: %d MiB, %d%% compute in %d slices, has %d MiB, %d%% and %d slices; held by %s",
					n.Name, g.UUID, u.memMiB, u.cores, u.slices, g.SchedulableMemoryMiB, g.CoresPercent, inv.SplitCount, strings.Join(u.pods, " ")))
			}
		}
	}
	return bad, nil
}

// FailedScheduling returns the latest FailedScheduling message per pod UID in namespace.
func (c *Cluster) FailedScheduling(ctx context.Context, namespace string) (map[types.UID]string, error) {
	events, err := c.Client().CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedScheduling"})
	if err != nil {
		return nil, err
	}
	out := map[types.UID]string{}
	for _, e := range events.Items {
		out[e.InvolvedObject.UID] = e.Message
	}
	return out, nil
}

// ExtenderHeld scrapes the extender's /metrics and returns one line per GPU for which the
// extender counts memory, compute or slices held (pods bound or being bound): after every pod is
// gone, each line is a leaked reservation.
func (c *Cluster) ExtenderHeld(ctx context.Context) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.ExtenderURL()+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape the extender: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape the extender: status %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape the extender: %w", err)
	}
	var held []string
	for _, name := range []string{extender.MetricGPUMemoryAllocated, extender.MetricGPUCoresAllocated, extender.MetricGPUSlicesAllocated} {
		for _, m := range families[name].GetMetric() {
			if v := m.GetGauge().GetValue(); v != 0 {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				held = append(held, fmt.Sprintf("%s %s: %s=%g", l["node"], l["gpu"], name, v))
			}
		}
	}
	slices.Sort(held)
	return held, nil
}

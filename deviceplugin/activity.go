package deviceplugin

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// ActivitySource is implemented by GPU backends that read what runs on
// the GPUs (NVML, fake GPUs). With it the plugin exports memory used,
// utilisation and each container's GPU memory (docs/metrics.md).
type ActivitySource interface {
	// Activity reads every answering GPU's memory in use, utilisation and
	// compute processes.
	Activity() ([]vgpu.GPUActivity, error)
}

// XIDCounter is implemented by GPU backends that count XIDs per GPU.
type XIDCounter interface {
	// XIDCounts returns the XIDs seen since start, by GPU UUID and XID.
	XIDCounts() map[string]map[uint64]uint64
}

// podResourcesTimeout bounds the PodResources List one scrape makes.
const podResourcesTimeout = 2 * time.Second

// Metric names of the per-GPU and per-container figures (docs/metrics.md).
const (
	MetricGPUMemoryTotal          = "gpuslice_deviceplugin_gpu_memory_total_mib"
	MetricGPUMemoryAllocated      = "gpuslice_deviceplugin_gpu_memory_allocated_mib"
	MetricGPUCoresAllocated       = "gpuslice_deviceplugin_gpu_cores_allocated_percent"
	MetricGPUSlicesAllocated      = "gpuslice_deviceplugin_gpu_slices_allocated"
	MetricGPUXIDs                 = "gpuslice_deviceplugin_gpu_xids_total"
	MetricGPUMemoryUsed           = "gpuslice_deviceplugin_gpu_memory_used_mib"
	MetricGPUUtilization          = "gpuslice_deviceplugin_gpu_utilization_percent"
	MetricGPUMemoryUnattributed   = "gpuslice_deviceplugin_gpu_memory_unattributed_mib"
	MetricContainerGPUMemoryUsed  = "gpuslice_deviceplugin_container_gpu_memory_used_mib"
	MetricContainerGPUMemoryLimit = "gpuslice_deviceplugin_container_gpu_memory_limit_mib"
	MetricContainerGPUCoresLimit  = "gpuslice_deviceplugin_container_gpu_cores_limit_percent"
)

var (
	gpuLabels       = []string{"gpu"}
	containerLabels = []string{"namespace", "pod", "container", "gpu"}

	gpuMemoryTotalDesc = prometheus.NewDesc(MetricGPUMemoryTotal,
		"Physical memory of the advertised GPU, in MiB.", gpuLabels, nil)
	gpuMemoryAllocatedDesc = prometheus.NewDesc(MetricGPUMemoryAllocated,
		"GPU memory held by the slices of the node's pods that are not finished, in MiB (their limits, from the allocation annotation).", gpuLabels, nil)
	gpuCoresAllocatedDesc = prometheus.NewDesc(MetricGPUCoresAllocated,
		"Compute reserved on the GPU by the slices of the node's pods that are not finished, in percent of the GPU.", gpuLabels, nil)
	gpuSlicesAllocatedDesc = prometheus.NewDesc(MetricGPUSlicesAllocated,
		"Slices (containers) of the node's pods that are not finished on the GPU.", gpuLabels, nil)
	gpuXIDsDesc = prometheus.NewDesc(MetricGPUXIDs,
		"XIDs the health watch saw on the GPU since the plugin started, by XID, application faults included.", []string{"gpu", "xid"}, nil)
	gpuMemoryUsedDesc = prometheus.NewDesc(MetricGPUMemoryUsed,
		"GPU memory in use as NVML reports it (every process and the driver), in MiB.", gpuLabels, nil)
	gpuUtilizationDesc = prometheus.NewDesc(MetricGPUUtilization,
		"Share of NVML's last sample period in which a kernel ran on the GPU, in percent.", gpuLabels, nil)
	gpuMemoryUnattributedDesc = prometheus.NewDesc(MetricGPUMemoryUnattributed,
		"GPU memory held by compute processes that are in no container of the node's GPU pods (host processes, or a container the plugin cannot see), in MiB.", gpuLabels, nil)
	containerMemoryUsedDesc = prometheus.NewDesc(MetricContainerGPUMemoryUsed,
		"GPU memory held by the container's own processes on the GPU (NVML's per-process memory, mapped through the processes' cgroups), in MiB. One series per running container holding a slice of the GPU.", containerLabels, nil)
	containerMemoryLimitDesc = prometheus.NewDesc(MetricContainerGPUMemoryLimit,
		"The memory limit of the container's slice of the GPU, in MiB.", containerLabels, nil)
	containerCoresLimitDesc = prometheus.NewDesc(MetricContainerGPUCoresLimit,
		"The compute of the container's slice of the GPU, in percent (0: best effort).", containerLabels, nil)
)

// gpuCollector computes the per-GPU and per-container metrics at scrape
// time from the inventory, the pod view's allocations, the kubelet's
// PodResources and the backend's activity. It makes one PodResources List
// and one NVML read per GPU per scrape, and no API server request.
type gpuCollector struct {
	p *Plugin
}

// Describe implements prometheus.Collector.
func (c *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{gpuMemoryTotalDesc, gpuMemoryAllocatedDesc, gpuCoresAllocatedDesc, gpuSlicesAllocatedDesc, gpuXIDsDesc,
		gpuMemoryUsedDesc, gpuUtilizationDesc, gpuMemoryUnattributedDesc, containerMemoryUsedDesc, containerMemoryLimitDesc, containerCoresLimitDesc} {
		ch <- d
	}
}

// containerGPU is one container's slice of one GPU.
type containerGPU struct {
	ref containerRef
	gpu string
}

// sliceFigures are what a containerGPU is given and uses.
type sliceFigures struct {
	limitMiB     int64
	coresPercent int
	hasLimit     bool
	usedMiB      int64
}

// Collect implements prometheus.Collector.
func (c *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	inv := c.p.inv.Load()
	if inv == nil {
		return
	}
	node, _, _ := inv.snapshot()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	known := map[string]bool{}
	for _, g := range node.GPUs {
		known[g.UUID] = true
		gauge(gpuMemoryTotalDesc, float64(g.TotalMemoryMiB), g.UUID)
	}

	slices := c.slices(known)
	type gpuTotals struct {
		memoryMiB int64
		cores     int
		slices    int
	}
	totals := map[string]*gpuTotals{}
	for _, g := range node.GPUs {
		totals[g.UUID] = &gpuTotals{}
	}
	for k, f := range slices {
		t := totals[k.gpu]
		t.memoryMiB += f.limitMiB
		t.cores += f.coresPercent
		t.slices++
	}
	for _, g := range node.GPUs {
		t := totals[g.UUID]
		gauge(gpuMemoryAllocatedDesc, float64(t.memoryMiB), g.UUID)
		gauge(gpuCoresAllocatedDesc, float64(t.cores), g.UUID)
		gauge(gpuSlicesAllocatedDesc, float64(t.slices), g.UUID)
	}

	if xc, ok := c.p.backend.(XIDCounter); ok {
		for uuid, byXID := range xc.XIDCounts() {
			if !known[uuid] {
				continue
			}
			for xid, n := range byXID {
				ch <- prometheus.MustNewConstMetric(gpuXIDsDesc, prometheus.CounterValue, float64(n), uuid, strconv.FormatUint(xid, 10))
			}
		}
	}

	if as, ok := c.p.backend.(ActivitySource); ok {
		if activity, err := as.Activity(); err == nil {
			c.attribute(activity, known, slices, gauge)
		}
	}
	for k, f := range slices {
		labels := []string{k.ref.Namespace, k.ref.Pod, k.ref.Container, k.gpu}
		gauge(containerMemoryUsedDesc, float64(f.usedMiB), labels...)
		if f.hasLimit {
			gauge(containerMemoryLimitDesc, float64(f.limitMiB), labels...)
			gauge(containerCoresLimitDesc, float64(f.coresPercent), labels...)
		}
	}
}

// slices returns the slices of the node's running GPU containers: those
// the kubelet's PodResources lists with this plugin's devices, each with
// the limit its pod's allocation gives it. When PodResources cannot be
// read, the allocations of the pods that are not finished stand in.
func (c *gpuCollector) slices(known map[string]bool) map[containerGPU]*sliceFigures {
	out := map[containerGPU]*sliceFigures{}
	alloc := c.p.alloc.Load()
	if alloc == nil {
		return out
	}
	limits := map[containerGPU]vgpu.GPUSlice{}
	if alloc.pods != nil {
		for _, pod := range alloc.pods.Pods() {
			if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				continue
			}
			a, ok, err := alloc.pods.Allocation(pod)
			if !ok || err != nil {
				continue
			}
			for _, ca := range a.Containers {
				for _, s := range ca.GPUs {
					limits[containerGPU{containerRef{pod.Namespace, pod.Name, ca.Name}, s.UUID}] = s
				}
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), podResourcesTimeout)
	defer cancel()
	listed, err := alloc.lister.List(ctx)
	if err != nil {
		for k, s := range limits {
			if known[k.gpu] {
				out[k] = &sliceFigures{limitMiB: s.MemoryMiB, coresPercent: s.CoresPercent, hasLimit: true}
			}
		}
		return out
	}
	for ref, ids := range containerDevices(listed, c.p.cfg.ResourceName) {
		for _, id := range ids {
			uuid, ok := GPUOfDeviceID(id)
			if !ok || !known[uuid] {
				continue
			}
			k := containerGPU{ref, uuid}
			if _, seen := out[k]; seen {
				continue
			}
			f := &sliceFigures{}
			if s, ok := limits[k]; ok {
				f.limitMiB, f.coresPercent, f.hasLimit = s.MemoryMiB, s.CoresPercent, true
			}
			out[k] = f
		}
	}
	return out
}

// attribute exports the GPUs' activity and adds each compute process's
// memory to the slice of the container it runs in (its cgroup names the
// pod UID and container ID; the pod view names the pod and container).
// Memory of processes in no known slice is exported as unattributed.
func (c *gpuCollector) attribute(activity []vgpu.GPUActivity, known map[string]bool, slices map[containerGPU]*sliceFigures, gauge func(*prometheus.Desc, float64, ...string)) {
	owners := c.containerOwners()
	for _, a := range activity {
		if !known[a.UUID] {
			continue
		}
		gauge(gpuMemoryUsedDesc, float64(a.MemoryUsedMiB), a.UUID)
		gauge(gpuUtilizationDesc, float64(a.UtilizationPercent), a.UUID)
		var unattributed int64
		for _, proc := range a.Processes {
			pc, ok := readProcessContainer(c.p.cfg.ProcDir, proc.PID)
			ref, owned := owners[pc]
			f := slices[containerGPU{ref, a.UUID}]
			if !ok || !owned || f == nil {
				unattributed += proc.MemoryMiB
				continue
			}
			f.usedMiB += proc.MemoryMiB
		}
		gauge(gpuMemoryUnattributedDesc, float64(unattributed), a.UUID)
	}
}

// containerOwners maps the pod UID and container ID of every container of
// the node's pods (from their statuses) to the container's name.
func (c *gpuCollector) containerOwners() map[processContainer]containerRef {
	out := map[processContainer]containerRef{}
	alloc := c.p.alloc.Load()
	if alloc == nil || alloc.pods == nil {
		return out
	}
	for _, pod := range alloc.pods.Pods() {
		add := func(statuses []corev1.ContainerStatus) {
			for _, s := range statuses {
				if s.ContainerID != "" {
					out[processContainer{PodUID: pod.UID, ContainerID: containerIDOf(s.ContainerID)}] = containerRef{pod.Namespace, pod.Name, s.Name}
				}
			}
		}
		add(pod.Status.InitContainerStatuses)
		add(pod.Status.ContainerStatuses)
	}
	return out
}

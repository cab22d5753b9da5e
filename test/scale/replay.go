package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/simulate"
)

// Defaults of ReplayConfig.
const (
	// DefaultReplayMaxPods is the hollow trace nodes' pods capacity: high enough never to bind,
	// as the simulator has no pod limit (a GPU of 20 slices holds 20 tasks).
	DefaultReplayMaxPods = 1000
	// DefaultPodTimeout bounds the wait for one replayed pod to be bound or unschedulable.
	DefaultPodTimeout = time.Minute
	// PhaseReplay is the LabelPhase value of replayed pods.
	PhaseReplay = "replay"
)

// ReplayConfig is one FGD replay through the real scheduler path.
type ReplayConfig struct {
	// Harness is the cluster; Replay sets its Nodes to the trace's GPU nodes (TraceNodes with
	// simulate.DefaultSplitCount slices per GPU) and, through ChartSet, the extender's node and
	// GPU policy to Policy.
	Harness Config
	// Rows and Tasks are the trace's node list and pod list.
	Rows  []simulate.Node
	Tasks []simulate.Task
	// Policy is a vgpu policy (binpack, spread or fragmentation); Seed orders the tasks as
	// simulate.Arrivals does.
	Policy simulate.Policy
	Seed   uint64
	// PodTimeout bounds each pod's wait; 0 means DefaultPodTimeout.
	PodTimeout time.Duration
	// CPUTasks is where the tasks without GPUs go: CPUTasksGpuslice (the default) or
	// CPUTasksDefaultScheduler.
	CPUTasks string
}

// Where ReplayConfig.CPUTasks sends the tasks without GPUs.
const (
	// CPUTasksGpuslice sends them to the gpuslice profile, with the chart's
	// scheduler.extender.placePodsWithoutGPU on: the extender places them as the simulator does.
	CPUTasksGpuslice = "gpuslice"
	// CPUTasksDefaultScheduler leaves them to default-scheduler, as a cluster does where pods
	// without GPUs are not sent to the gpuslice profile.
	CPUTasksDefaultScheduler = "default-scheduler"
)

// ReplayResult compares the real path with the simulator.
type ReplayResult struct {
	// Policy, Seed and CPUTasks are the replay's.
	Policy   simulate.Policy
	Seed     uint64
	CPUTasks string
	// Arrived, Placed and Failed count the tasks sent through the real path; GPUPlaced and
	// GPUFailed the ones that ask for GPUs, CPUPlaced and CPUFailed the others (placed as
	// CPUTasks says). TimedOut counts pods neither bound nor marked
	// unschedulable in time (counted as failed).
	Arrived, Placed, Failed int
	GPUPlaced, GPUFailed    int
	CPUPlaced, CPUFailed    int
	TimedOut                int
	// CapacityMilli and AllocatedMilli are the GPU capacity and what the bound tasks ask for,
	// in thousandths of a GPU.
	CapacityMilli, AllocatedMilli int64
	// UnallocatedPercent is the share of GPU capacity left unallocated with every arrival placed
	// or turned away: the metric at 100% arrived demand.
	UnallocatedPercent float64
	// Simulated is vgpu/simulate's replay of the same seed and policy, as `gpuslice simulate`
	// runs it (fragmentation measured against the workload learnt online from the tasks, as the
	// extender's default workload: online does); SimulatedDefault the same with
	// vgpu.DefaultWorkload(), as the extender measures with workload: default.
	Simulated, SimulatedDefault simulate.Result
	// Elapsed is the real replay's wall time.
	Elapsed time.Duration
	// Check is the correctness check of the bound GPU pods.
	Check CheckResult
	// Profile is the chart's scheduler configuration kube-scheduler ran.
	Profile ChartProfile
}

// Replay places the trace's tasks through kube-scheduler and the extender one at a time, in the
// order simulate.Arrivals gives for the seed, up to 100% arrived GPU demand: create the pod,
// wait until it is bound or marked unschedulable, and delete it when it is not bound (the
// simulator drops a task that fits nowhere, so nothing is retried later). It then runs
// simulate.Replay for the same seed and policy in-process and returns both figures.
func Replay(ctx context.Context, cfg ReplayConfig) (res ReplayResult, err error) {
	if _, err := vgpu.ParsePolicy(string(cfg.Policy)); err != nil || cfg.Policy == "" {
		return res, fmt.Errorf("replay policy %q: must be one of %s (the extender has no random policy)", cfg.Policy, vgpu.PolicyList())
	}
	if cfg.PodTimeout == 0 {
		cfg.PodTimeout = DefaultPodTimeout
	}
	switch cfg.CPUTasks {
	case "":
		cfg.CPUTasks = CPUTasksGpuslice
	case CPUTasksGpuslice, CPUTasksDefaultScheduler:
	default:
		return res, fmt.Errorf("replay CPUTasks %q: must be %q or %q", cfg.CPUTasks, CPUTasksGpuslice, CPUTasksDefaultScheduler)
	}
	res = ReplayResult{Policy: cfg.Policy, Seed: cfg.Seed, CPUTasks: cfg.CPUTasks}
	simCfg := simulate.Config{Policy: cfg.Policy, Seed: cfg.Seed}
	if res.Simulated, err = simulate.Replay(cfg.Rows, cfg.Tasks, simCfg); err != nil {
		return res, err
	}
	simCfg.Workload = vgpu.DefaultWorkload()
	if res.SimulatedDefault, err = simulate.Replay(cfg.Rows, cfg.Tasks, simCfg); err != nil {
		return res, err
	}
	order, err := simulate.Arrivals(cfg.Rows, cfg.Tasks, simulate.Config{Seed: cfg.Seed})
	if err != nil {
		return res, err
	}
	res.CapacityMilli = res.Simulated.CapacityMilli

	cfg.Harness.Nodes = TraceNodes(cfg.Rows, simulate.DefaultSplitCount, DefaultReplayMaxPods)
	cfg.Harness.ChartSet = append(cfg.Harness.ChartSet,
		"scheduler.extender.nodePolicy="+string(cfg.Policy), "scheduler.extender.gpuPolicy="+string(cfg.Policy))
	if cfg.CPUTasks == CPUTasksGpuslice {
		cfg.Harness.ChartSet = append(cfg.Harness.ChartSet, "scheduler.extender.placePodsWithoutGPU=true")
	}
	h, err := Start(ctx, cfg.Harness)
	if err != nil {
		return res, err
	}
	defer func() {
		if stopErr := h.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
	}()
	res.Profile = h.Profile
	pods := h.client.CoreV1().Pods(h.cfg.Namespace)
	began := time.Now()
	lastLog := began
	for i, t := range order {
		p, err := taskPod(fmt.Sprintf("task-%05d", i), t)
		if err != nil {
			return res, err
		}
		p.Namespace = h.cfg.Namespace
		if t.GPUs == 0 && cfg.CPUTasks == CPUTasksGpuslice {
			p.Spec.SchedulerName = cluster.SchedulerName
		}
		created, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return res, fmt.Errorf("replay: create pod for task %s: %w", t.Name, err)
		}
		bound, unschedulable := h.watch.waitPod(ctx, created.UID, time.Now().Add(cfg.PodTimeout))
		if err := ctx.Err(); err != nil {
			return res, err
		}
		res.Arrived++
		switch {
		case bound:
			res.Placed++
			res.AllocatedMilli += t.DemandMilli()
			if t.GPUs > 0 {
				res.GPUPlaced++
			} else {
				res.CPUPlaced++
			}
		default:
			if !unschedulable {
				res.TimedOut++
			}
			res.Failed++
			if t.GPUs > 0 {
				res.GPUFailed++
			} else {
				res.CPUFailed++
			}
			err := pods.Delete(ctx, created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: metav1.NewUIDPreconditions(string(created.UID))})
			if err != nil {
				return res, fmt.Errorf("replay: delete unplaced pod %s: %w", created.Name, err)
			}
		}
		if time.Since(lastLog) >= progressEvery {
			lastLog = time.Now()
			h.cfg.Logf("replay: %d/%d tasks, %d placed, %d failed, %.2f%% of GPU capacity allocated after %v",
				res.Arrived, len(order), res.Placed, res.Failed, 100*float64(res.AllocatedMilli)/float64(res.CapacityMilli), time.Since(began).Round(time.Second))
		}
	}
	res.Elapsed = time.Since(began)
	res.UnallocatedPercent = 100 * (1 - float64(res.AllocatedMilli)/float64(res.CapacityMilli))
	res.Check = h.Check(PhaseReplay)
	return res, nil
}

// taskPod is the pod of trace task t: one container requesting the task's CPU and memory and,
// for a GPU task, what simulate.PodDemand asks for: whole GPUs as hami.io/gpu alone (exclusive),
// shares as hami.io/gpu with the same percent of memory (hami.io/gpumem-percentage) and compute
// (hami.io/gpucores); the model filter as the hami.io/gpu-model annotation.
func taskPod(name string, t simulate.Task) (*corev1.Pod, error) {
	d := simulate.PodDemand(t)
	var limits corev1.ResourceList
	switch len(d.Request.Containers) {
	case 0:
	case 1:
		c := d.Request.Containers[0]
		limits = corev1.ResourceList{vgpu.ResourceGPU: *resource.NewQuantity(int64(c.GPUs), resource.DecimalSI)}
		if !c.Exclusive {
			limits[vgpu.ResourceMemoryPercentage] = *resource.NewQuantity(int64(c.MemoryPercent), resource.DecimalSI)
			limits[vgpu.ResourceCores] = *resource.NewQuantity(int64(c.CoresPercent), resource.DecimalSI)
		}
	default:
		return nil, fmt.Errorf("task %s: %d GPU containers, want at most 1", t.Name, len(d.Request.Containers))
	}
	p := pod(name, limits)
	p.Labels = map[string]string{LabelPhase: PhaseReplay}
	p.Annotations = map[string]string{"gpuslice.io/trace-task": t.Name}
	if len(d.Constraints.Models) > 0 {
		p.Annotations[vgpu.AnnotationGPUModel] = strings.Join(d.Constraints.Models, ",")
	}
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(d.Host.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(d.Host.MemoryMiB<<20, resource.BinarySI),
	}
	return p, nil
}

// WriteReplay writes r beside the simulator's figures.
func WriteReplay(w io.Writer, r ReplayResult) {
	fmt.Fprintf(w, "\n== FGD replay through kube-scheduler + extender: policy %s, seed %d, tasks without GPUs to %s ==\n", r.Policy, r.Seed, r.CPUTasks)
	fmt.Fprintf(w, "real path:  unallocated GPU %.2f%% at 100%% arrived demand; %d tasks arrived, %d placed (%d GPU, %d CPU-only), %d failed (%d GPU, %d CPU-only, %d timed out), in %v\n",
		r.UnallocatedPercent, r.Arrived, r.Placed, r.GPUPlaced, r.CPUPlaced, r.Failed, r.GPUFailed, r.CPUFailed, r.TimedOut, r.Elapsed.Round(time.Second))
	for _, s := range []struct {
		name string
		res  simulate.Result
	}{{"simulate (online workload, as gpuslice simulate and the extender's workload: online)", r.Simulated}, {"simulate (vgpu.DefaultWorkload, as the extender's workload: default)", r.SimulatedDefault}} {
		fmt.Fprintf(w, "%s: unallocated GPU %.2f%%; %d arrived, %d placed, %d failed; real path − simulator = %+.2f points\n",
			s.name, s.res.UnallocatedPercent, s.res.Arrived, s.res.Placed, s.res.Failed, r.UnallocatedPercent-s.res.UnallocatedPercent)
	}
	fmt.Fprintf(w, "correctness: %d bound GPU pods checked, %d violations\n", r.Check.Pods, len(r.Check.Violations))
	fmt.Fprintf(w, "kube-scheduler ran the chart's profile:\n%s", indent(r.Profile.SchedulerConfig))
}

// indent indents each line of s by four spaces.
func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n") + "\n"
}

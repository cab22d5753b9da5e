package simulate

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Policy is how the replay chooses nodes and GPUs: one of vgpu's policies,
// used for both nodes and GPUs, or PolicyRandom.
type Policy string

const (
	// PolicyBinpack is vgpu.PolicyBinpack for nodes and GPUs.
	PolicyBinpack = Policy(vgpu.PolicyBinpack)
	// PolicySpread is vgpu.PolicySpread for nodes and GPUs.
	PolicySpread = Policy(vgpu.PolicySpread)
	// PolicyFragmentation is vgpu.PolicyFragmentation for nodes and GPUs.
	PolicyFragmentation = Policy(vgpu.PolicyFragmentation)
	// PolicyRandom places each task on a node drawn uniformly from those it
	// fits, on GPUs chosen by vgpu.PolicyBinpack: the paper's baseline.
	PolicyRandom Policy = "random"
	// PolicyFGD is the paper's algorithm, in vgpu's model, for side-by-side
	// runs: vgpu.PolicyFragmentation for nodes and GPUs, measured against
	// the whole task list known in advance, each GPU task weighing 1 (the
	// paper's task popularity), tasks without GPUs left out (for them the
	// paper counts every free GPU as fragmented wherever a task goes), no
	// GPU supply, and the paper's host rule (vgpu.Workload.SetHostFitOnly).
	PolicyFGD Policy = "fgd"
)

// Policies lists the replay policies in the order reports show them.
func Policies() []Policy {
	return []Policy{PolicyRandom, PolicySpread, PolicyBinpack, PolicyFGD, PolicyFragmentation}
}

// Defaults of Config.
const (
	// DefaultTune is the paper's demand multiple: copies are appended until
	// the demand is 130% of the capacity.
	DefaultTune = 1.3
	// DefaultSplitCount lets a GPU hold 20 slices, as many as the trace's
	// smallest share (50 thousandths) needs.
	DefaultSplitCount = 20
)

// ErrNoCapacity is returned when the nodes have no GPU.
var ErrNoCapacity = errors.New("the nodes have no GPU")

// Config is one replay.
type Config struct {
	// Policy chooses nodes and GPUs; "" means PolicyBinpack.
	Policy Policy
	// Seed drives the shuffle, the appended copies and PolicyRandom.
	Seed uint64
	// Tune is the demand, as a multiple of capacity, that appended copies
	// bring the task list to; 0 means DefaultTune. Values below 1 are
	// raised to 1: the metric needs demand to reach the capacity.
	Tune float64
	// SplitCount is the slices per GPU; 0 means DefaultSplitCount.
	SplitCount int
	// Workload is what PolicyFragmentation measures against; nil means
	// estimated online, as a scheduler would: each task is added
	// (vgpu.Workload.Add) as it arrives, before it is placed, with a half
	// life of HalfLife tasks, and the workload knows the nodes' GPUs by
	// model (vgpu.Workload.SetSupply). PolicyFGD ignores it.
	Workload *vgpu.Workload
	// HalfLife is the online workload's half life in tasks; 0 means
	// DefaultHalfLife, below 0 never forgets.
	HalfLife float64
	// DeviceOrder is the device order of DRA-mode nodes (PolicyDRA,
	// PolicyDRAGpuslice); "" means DeviceOrderIndex.
	DeviceOrder DeviceOrder
}

// DefaultHalfLife is the half life, in tasks, of the workload
// PolicyFragmentation estimates online: long enough that the workload's
// rarer shapes are seen tens of times, short enough to follow a mix that
// changes over a few thousand pods.
const DefaultHalfLife = 2000

// Result is the outcome of one replay.
type Result struct {
	// Policy and Seed are the replay's.
	Policy Policy
	Seed   uint64
	// CapacityMilli is the nodes' GPU capacity in thousandths of a GPU.
	CapacityMilli int64
	// Arrived, Placed and Failed count tasks up to the one whose arrival
	// brought the demand to the capacity.
	Arrived, Placed, Failed int
	// AllocatedMilli is the GPU capacity allocated at that moment.
	AllocatedMilli int64
	// UnallocatedPercent is 100 × (1 − AllocatedMilli/CapacityMilli): the
	// paper's "unallocated GPU" at 100% arrived demand.
	UnallocatedPercent float64
	// Failures are the failed tasks by shape, most GPU demand first (ties:
	// fewer GPUs, then smaller share, then models).
	Failures []Failure
}

// Failure counts the failed tasks of one shape: GPUs of GPUMilli each, on
// the models given (gpu_spec; "" for any).
type Failure struct {
	GPUs     int
	GPUMilli int64
	Models   string
	Tasks    int
	// DemandMilli is their GPU demand, in thousandths of a GPU.
	DemandMilli int64
}

// simNode is a node as the replay holds it.
type simNode struct {
	inv              vgpu.NodeInventory
	usage            vgpu.NodeUsage
	cpuFree, memFree int64
	// freeGPUs is the healthy capacity not in use, in GPUs, as Fit last
	// reported; a task needing more cannot fit, so Fit is not called.
	freeGPUs float64
	// state is the node's state as Fit and the placement rules see it
	// (see stateKey): nodes of equal state give equal placements and
	// scores, so place judges only the first of them.
	state string
}

// stateKey is what makes n's placements what they are: its GPUs' model,
// memory and usage in inventory order, and its free CPU and memory.
func stateKey(n *simNode) string {
	b := make([]byte, 0, 16+24*len(n.inv.GPUs))
	b = strconv.AppendInt(b, n.cpuFree, 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, n.memFree, 10)
	for _, g := range n.inv.GPUs {
		u := n.usage.GPU(g.UUID)
		b = append(b, '|')
		b = append(b, g.Model...)
		for _, v := range []int64{g.SchedulableMemoryMiB, int64(g.CoresPercent), u.MemoryMiB, int64(u.CoresPercent), int64(u.Slices), int64(u.Exclusive)} {
			b = append(b, ',')
			b = strconv.AppendInt(b, v, 10)
		}
	}
	return string(b)
}

// task is a trace task in vgpu terms.
type task struct {
	Task
	pod  vgpu.PodDemand
	need float64 // GPUs' worth of capacity the task needs at least
}

// Replay places tasks on nodes as Config says and returns the packing
// metric. Node CPU and host memory are checked before vgpu.Fit, as the
// kube-scheduler would, and passed to Fit as the node's free host
// resources. Tasks without GPUs go, for every policy but PolicyRandom, to
// the node where CPU is most in surplus: free CPU after the task, less what
// the node's free GPU capacity would need at the tasks' average CPU per GPU
// (PolicyFragmentation: vgpu.Score's, at the workload's CPU per GPU, as the
// extender places such pods when the chart sends them to it). Ties go to
// the earlier node. It is pure and deterministic for a given Config.
func Replay(nodes []Node, tasks []Task, cfg Config) (Result, error) {
	if cfg.Policy == "" {
		cfg.Policy = PolicyBinpack
	}
	if cfg.Tune == 0 {
		cfg.Tune = DefaultTune
	}
	cfg.Tune = max(cfg.Tune, 1)
	if cfg.SplitCount == 0 {
		cfg.SplitCount = DefaultSplitCount
	}
	if cfg.Policy == PolicyDRA {
		return replayDRA(nodes, tasks, cfg)
	}
	opts := vgpu.FitOptions{NodePolicy: vgpu.Policy(cfg.Policy), GPUPolicy: vgpu.Policy(cfg.Policy)}
	switch cfg.Policy {
	case PolicyRandom:
		opts = vgpu.FitOptions{NodePolicy: vgpu.PolicyBinpack, GPUPolicy: vgpu.PolicyBinpack}
	case PolicyFGD:
		opts = vgpu.FitOptions{NodePolicy: vgpu.PolicyFragmentation, GPUPolicy: vgpu.PolicyFragmentation}
	case PolicyDRAGpuslice:
		opts = vgpu.FitOptions{NodePolicy: vgpu.PolicyFragmentation, GPUPolicy: draGPUPolicy(cfg.DeviceOrder)}
		cfg.SplitCount = vgpu.DRASplitCount
	default:
		if _, err := vgpu.ParsePolicy(string(cfg.Policy)); err != nil {
			return Result{}, fmt.Errorf("policy: %w", err)
		}
	}
	res := Result{Policy: cfg.Policy, Seed: cfg.Seed}
	cluster := make([]simNode, 0, len(nodes))
	for _, n := range nodes {
		cluster = append(cluster, newSimNode(n, cfg.SplitCount))
		res.CapacityMilli += int64(n.GPUs) * 1000
	}
	if res.CapacityMilli == 0 {
		return Result{}, ErrNoCapacity
	}
	all := make([]task, len(tasks))
	for i, t := range tasks {
		all[i] = newTask(t)
	}
	online := cfg.Workload == nil && cfg.Policy.scoresByFragmentation()
	switch {
	case cfg.Policy == PolicyFGD:
		opts.Workload = fgdWorkload(all)
	case online:
		opts.Workload = onlineWorkload(nodes, cfg.HalfLife)
	default:
		opts.Workload = cfg.Workload
	}
	var gpuTaskCPU, gpuTaskMilli float64
	for _, t := range tasks {
		if t.GPUs > 0 {
			gpuTaskCPU += float64(t.CPUMilli)
			gpuTaskMilli += float64(t.DemandMilli())
		}
	}
	cpuPerGPU := 0.0
	if gpuTaskMilli > 0 {
		cpuPerGPU = gpuTaskCPU / gpuTaskMilli * 1000
	}
	rng := newRNG(cfg.Seed)
	order := arrivals(all, rng, float64(res.CapacityMilli)*cfg.Tune)

	var arrived int64
	judged := map[string]struct{}{}
	failures := map[Failure]int{}
	for _, t := range order {
		res.Arrived++
		arrived += t.DemandMilli()
		if online {
			opts.Workload.Add(t.pod)
		}
		if place(cluster, t, opts, cfg.Policy, cpuPerGPU, rng, judged) {
			res.Placed++
			res.AllocatedMilli += t.DemandMilli()
		} else {
			res.Failed++
			failures[Failure{GPUs: t.GPUs, GPUMilli: t.GPUMilli, Models: strings.Join(t.Models, "|")}]++
		}
		if arrived >= res.CapacityMilli {
			break
		}
	}
	res.UnallocatedPercent = 100 * (1 - float64(res.AllocatedMilli)/float64(res.CapacityMilli))
	res.Failures = sortedFailures(failures)
	return res, nil
}

// sortedFailures lists failures (shape: tasks) in Result.Failures' order.
func sortedFailures(failures map[Failure]int) []Failure {
	out := make([]Failure, 0, len(failures))
	for f, n := range failures {
		f.Tasks = n
		f.DemandMilli = int64(n) * int64(f.GPUs) * f.GPUMilli
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b Failure) int {
		return cmp.Or(cmp.Compare(b.DemandMilli, a.DemandMilli), cmp.Compare(a.GPUs, b.GPUs),
			cmp.Compare(a.GPUMilli, b.GPUMilli), cmp.Compare(a.Models, b.Models))
	})
	return out
}

func newSimNode(n Node, split int) simNode {
	inv := vgpu.NodeInventory{Node: n.Name, SplitCount: split, MemoryScaling: 1}
	mem := modelMemoryMiB(n.Model)
	for i := range n.GPUs {
		inv.GPUs = append(inv.GPUs, vgpu.GPU{
			UUID: n.Name + "-gpu" + strconv.Itoa(i), Index: i, Minor: i, Model: n.Model,
			TotalMemoryMiB: mem, SchedulableMemoryMiB: mem, CoresPercent: vgpu.MaxPercent,
			NUMANode: -1, Health: vgpu.Healthy,
		})
	}
	sn := simNode{inv: inv, cpuFree: n.CPUMilli, memFree: n.MemoryMiB, freeGPUs: float64(n.GPUs)}
	sn.state = stateKey(&sn)
	return sn
}

// modelMemoryMiB is the memory of the trace's GPU models. Tasks ask for a
// share of a GPU, so only the ratio matters; undisclosed models (G1–G3)
// get 32 GiB.
func modelMemoryMiB(model string) int64 {
	switch model {
	case "T4", "P100", "V100M16":
		return 16 << 10
	case "A10":
		return 24 << 10
	}
	return 32 << 10
}

// newTask maps a trace task to a vgpu request: gpu_milli becomes the same
// percent of compute and of memory; whole GPUs (gpu_milli 1000, and every
// multi-GPU task) are exclusive; gpu_spec is the model filter.
func newTask(t Task) task {
	out := task{Task: t, pod: vgpu.PodDemand{
		Constraints: vgpu.Constraints{Models: t.Models},
		Host:        vgpu.HostResources{CPUMilli: t.CPUMilli, MemoryMiB: t.MemoryMiB},
	}}
	if t.GPUs == 0 {
		return out
	}
	cr := vgpu.ContainerRequest{Name: "main", GPUs: t.GPUs}
	if t.GPUMilli >= 1000 {
		cr.MemoryPercent, cr.CoresPercent, cr.Exclusive = vgpu.MaxPercent, vgpu.MaxPercent, true
		out.need = float64(t.GPUs)
	} else {
		pct := int((t.GPUMilli + 9) / 10)
		cr.MemoryPercent, cr.CoresPercent = pct, pct
		out.need = float64(t.GPUs) * float64(pct) / 100
	}
	out.pod.Request = vgpu.PodRequest{Containers: []vgpu.ContainerRequest{cr}}
	return out
}

// arrivals shuffles tasks and appends random copies until the GPU demand
// reaches demand.
func arrivals(tasks []task, rng *rand.Rand, demand float64) []task {
	order := make([]task, len(tasks))
	copy(order, tasks)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var total float64
	for _, t := range order {
		total += float64(t.DemandMilli())
	}
	for total < demand && len(tasks) > 0 {
		t := tasks[rng.IntN(len(tasks))]
		order = append(order, t)
		total += float64(t.DemandMilli())
		if t.DemandMilli() == 0 && total == 0 {
			break
		}
	}
	return order
}

// place puts t on the best node and reports whether any fitted.
func place(cluster []simNode, t task, opts vgpu.FitOptions, policy Policy, cpuPerGPU float64, rng *rand.Rand, judged map[string]struct{}) bool {
	clear(judged)
	best, seen := -1, 0
	var bestPlacement vgpu.Placement
	var bestScore vgpu.NodeScore
	var bestSurplus float64
	for i := range cluster {
		n := &cluster[i]
		if n.cpuFree < t.CPUMilli || n.memFree < t.MemoryMiB || n.freeGPUs < t.need-0.01 {
			continue
		}
		// A node in the state of one judged before places and scores the
		// same, and loses the tie to it; random placement counts it.
		if policy != PolicyRandom {
			if _, ok := judged[n.state]; ok {
				continue
			}
			judged[n.state] = struct{}{}
		}
		host := vgpu.HostResources{CPUMilli: n.cpuFree, MemoryMiB: n.memFree}
		p, err := vgpu.Fit(t.pod, vgpu.NodeState{Inventory: n.inv, Usage: &n.usage, HostFree: &host}, opts)
		if err != nil {
			continue
		}
		seen++
		var better bool
		switch {
		case policy == PolicyRandom:
			better = rng.IntN(seen) == 0
		case t.GPUs == 0 && !policy.scoresByFragmentation():
			// Tasks without GPUs go where CPU is most in surplus: free CPU
			// after the task, less what the node's free GPU capacity would
			// need at the trace's CPU per GPU. PolicyFragmentation's Score
			// says the same at its workload's CPU per GPU, as the extender
			// scores such pods.
			surplus := float64(n.cpuFree-t.CPUMilli) - (float64(p.HealthyGPUs)-p.UsedAfter)*cpuPerGPU
			better = best < 0 || surplus > bestSurplus
			if better {
				bestSurplus = surplus
			}
		default:
			s := vgpu.Score(p)
			better = best < 0 || s.Compare(bestScore) > 0
			if better {
				bestScore = s
			}
		}
		if better {
			best, bestPlacement = i, p
		}
	}
	if best < 0 {
		return false
	}
	n := &cluster[best]
	n.cpuFree -= t.CPUMilli
	n.memFree -= t.MemoryMiB
	if len(t.pod.Request.Containers) > 0 {
		n.usage.Add(bestPlacement.Allocation, t.pod.Request)
		n.freeGPUs = float64(bestPlacement.HealthyGPUs) - bestPlacement.UsedAfter
	}
	n.state = stateKey(n)
	return true
}

func newRNG(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
}

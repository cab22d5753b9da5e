package simulate

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strings"
)

// PolicyDRA replays the tasks as kube-scheduler places resource claims on DRA-mode nodes
// (docs/dra.md): each GPU one device with consumable memory and cores, no split count. Inside a
// node the allocator takes the first devices, in the slice's order, that fit
// (k8s.io/dynamic-resource-allocation/structured: no scoring between devices). Between nodes
// kube-scheduler's default profile decides: the DynamicResources plugin scores only prioritized
// lists, which exact requests are not, so NodeResourcesFit (LeastAllocated on CPU and memory)
// and NodeResourcesBalancedAllocation, weight 1 each, choose among every feasible node (as with
// percentageOfNodesToScore 100), ties drawn at random as kube-scheduler's selectHost does.
// Tasks without GPUs are placed the same way.
const PolicyDRA Policy = "dra"

// draGPU is one device as the allocator sees it.
type draGPU struct {
	model                 string
	memoryMiB, memFreeMiB int64
	coresFree             int
}

// draNode is a node in the DRA replay.
type draNode struct {
	cpu, mem, cpuFree, memFree int64
	gpus                       []draGPU
	// order is deviceOrder's buffer.
	order []int
}

// draDemand is what one device of a task consumes.
type draDemand struct {
	memPercent, cores int // memPercent 100: the request policy's default, all of it
}

func draDemandOf(t Task) draDemand {
	if t.GPUMilli >= 1000 {
		return draDemand{memPercent: 100, cores: 100}
	}
	pct := int((t.GPUMilli + 9) / 10)
	return draDemand{memPercent: pct, cores: pct}
}

// modelOK is vgpu's model filter: a model matches when it contains one of the names, compared
// case-insensitively (the webhook turns it into the same CEL selector).
func modelOK(model string, models []string) bool {
	if len(models) == 0 {
		return true
	}
	for _, m := range models {
		if strings.Contains(strings.ToLower(model), strings.ToLower(m)) {
			return true
		}
	}
	return false
}

// firstFit returns the indexes of the first t.GPUs devices of n, in order, that fit t, or nil.
func (n *draNode) firstFit(t Task, d draDemand, order DeviceOrder) []int {
	var out []int
	for k := range n.gpus {
		i := k
		if order == DeviceOrderUsed {
			if k == 0 {
				n.order = n.deviceOrder(n.order[:0])
			}
			i = n.order[k]
		}
		g := &n.gpus[i]
		if !modelOK(g.model, t.Models) {
			continue
		}
		if g.memFreeMiB >= g.memoryMiB*int64(d.memPercent)/100 && g.coresFree >= d.cores {
			out = append(out, i)
			if len(out) == t.GPUs {
				return out
			}
		}
	}
	return nil
}

// deviceOrder appends to buf the positions of n's devices most used first, ties by index: the
// order of a ResourceSlice under DeviceOrderUsed.
func (n *draNode) deviceOrder(buf []int) []int {
	for i := range n.gpus {
		buf = append(buf, i)
	}
	used := func(g *draGPU) float64 {
		return max(1-float64(g.memFreeMiB)/float64(g.memoryMiB), 1-float64(g.coresFree)/100)
	}
	slices.SortStableFunc(buf, func(a, b int) int { return cmp.Compare(used(&n.gpus[b]), used(&n.gpus[a])) })
	return buf
}

// score is NodeResourcesFit's LeastAllocated plus NodeResourcesBalancedAllocation for t on n,
// each 0-100, from CPU and memory requests.
func (n *draNode) score(t Task) float64 {
	if n.cpu == 0 || n.mem == 0 {
		return 0
	}
	cpu := float64(n.cpu-n.cpuFree+t.CPUMilli) / float64(n.cpu)
	mem := float64(n.mem-n.memFree+t.MemoryMiB) / float64(n.mem)
	least := ((1 - cpu) + (1 - mem)) / 2 * 100
	diff := cpu - mem
	if diff < 0 {
		diff = -diff
	}
	balanced := (1 - diff/2) * 100
	return least + balanced
}

// replayDRA is Replay for PolicyDRA.
func replayDRA(nodes []Node, tasks []Task, cfg Config) (Result, error) {
	res := Result{Policy: cfg.Policy, Seed: cfg.Seed}
	cluster := make([]draNode, 0, len(nodes))
	for _, n := range nodes {
		dn := draNode{cpu: n.CPUMilli, mem: n.MemoryMiB, cpuFree: n.CPUMilli, memFree: n.MemoryMiB}
		mem := modelMemoryMiB(n.Model)
		for range n.GPUs {
			dn.gpus = append(dn.gpus, draGPU{model: n.Model, memoryMiB: mem, memFreeMiB: mem, coresFree: 100})
		}
		cluster = append(cluster, dn)
		res.CapacityMilli += int64(n.GPUs) * 1000
	}
	if res.CapacityMilli == 0 {
		return Result{}, ErrNoCapacity
	}
	all := make([]task, len(tasks))
	for i, t := range tasks {
		all[i] = newTask(t)
	}
	rng := newRNG(cfg.Seed)
	order := arrivals(all, rng, float64(res.CapacityMilli)*cfg.Tune)
	var arrived int64
	for _, t := range order {
		res.Arrived++
		arrived += t.DemandMilli()
		if placeDRA(cluster, t.Task, cfg.DeviceOrder, rng) {
			res.Placed++
			res.AllocatedMilli += t.DemandMilli()
		} else {
			res.Failed++
		}
		if arrived >= res.CapacityMilli {
			break
		}
	}
	res.UnallocatedPercent = 100 * (1 - float64(res.AllocatedMilli)/float64(res.CapacityMilli))
	return res, nil
}

// placeDRA puts t on the best-scoring node where it fits, first-fit devices there.
func placeDRA(cluster []draNode, t Task, order DeviceOrder, rng *rand.Rand) bool {
	d := draDemandOf(t)
	best, ties := -1, 0
	var bestScore float64
	var bestGPUs []int
	for i := range cluster {
		n := &cluster[i]
		if n.cpuFree < t.CPUMilli || n.memFree < t.MemoryMiB {
			continue
		}
		var gpus []int
		if t.GPUs > 0 {
			if gpus = n.firstFit(t, d, order); gpus == nil {
				continue
			}
		}
		s := n.score(t)
		switch {
		case best < 0 || s > bestScore:
			best, bestScore, bestGPUs, ties = i, s, gpus, 1
		case s == bestScore:
			ties++
			if rng.IntN(ties) == 0 {
				best, bestGPUs = i, gpus
			}
		}
	}
	if best < 0 {
		return false
	}
	n := &cluster[best]
	n.cpuFree -= t.CPUMilli
	n.memFree -= t.MemoryMiB
	for _, i := range bestGPUs {
		g := &n.gpus[i]
		g.memFreeMiB -= g.memoryMiB * int64(d.memPercent) / 100
		g.coresFree -= d.cores
	}
	return true
}

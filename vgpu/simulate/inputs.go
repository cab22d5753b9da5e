package simulate

import "github.com/gpuslice/gpuslice/vgpu"

// NodeInventory returns the inventory Replay gives node n: n.GPUs healthy
// GPUs of n.Model with the replay's memory for that model, full compute,
// splitCount slices each (0 means DefaultSplitCount), UUIDs n.Name+"-gpu"+
// index and NUMA node -1. Placers outside this package (a harness that
// publishes it on hollow Nodes) pack the same GPUs as Replay with it.
func NodeInventory(n Node, splitCount int) vgpu.NodeInventory {
	if splitCount == 0 {
		splitCount = DefaultSplitCount
	}
	return newSimNode(n, splitCount).inv
}

// PodDemand returns what Replay places for task t: gpu_milli as the same
// percent of each GPU's memory and compute, whole GPUs exclusive, gpu_spec
// as the model filter, and the task's CPU and host memory.
func PodDemand(t Task) vgpu.PodDemand {
	return newTask(t).pod
}

// Arrivals returns the tasks in the order Replay places them for cfg on
// nodes (the same shuffle and appended copies for the same seed and Tune),
// ending with the task whose arrival brings the GPU demand to the nodes'
// capacity, where Replay stops and measures. It returns ErrNoCapacity when
// the nodes have no GPU. It is pure and deterministic for a given cfg.
func Arrivals(nodes []Node, tasks []Task, cfg Config) ([]Task, error) {
	if cfg.Tune == 0 {
		cfg.Tune = DefaultTune
	}
	cfg.Tune = max(cfg.Tune, 1)
	var capacity int64
	for _, n := range nodes {
		capacity += int64(n.GPUs) * 1000
	}
	if capacity == 0 {
		return nil, ErrNoCapacity
	}
	all := make([]task, len(tasks))
	for i, t := range tasks {
		all[i] = newTask(t)
	}
	var out []Task
	var arrived int64
	for _, t := range arrivals(all, newRNG(cfg.Seed), float64(capacity)*cfg.Tune) {
		out = append(out, t.Task)
		if arrived += t.DemandMilli(); arrived >= capacity {
			break
		}
	}
	return out, nil
}

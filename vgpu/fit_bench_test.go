package vgpu_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// benchCluster is nodes of 8 GPUs of 80 GiB, each with a few slices taken.
func benchCluster(nodes int) ([]vgpu.NodeInventory, []*vgpu.NodeUsage) {
	invs := make([]vgpu.NodeInventory, nodes)
	usages := make([]*vgpu.NodeUsage, nodes)
	for i := range nodes {
		b := vgputest.Node(fmt.Sprintf("n%d", i))
		for g := range 8 {
			b.GPU(fmt.Sprintf("GPU-%d-%d", i, g), 81920)
		}
		invs[i] = b.Obj()
		a := vgputest.Allocation(invs[i].Node).
			Slice(invs[i].GPUs[i%8].UUID, 20480, 30).
			Container("b").Slice(invs[i].GPUs[(i+3)%8].UUID, 40960, 0).Obj()
		usages[i] = vgputest.Usage(a)
	}
	return invs, usages
}

// BenchmarkFit times Fit over 5,000 nodes of 8 GPUs for one pod (a
// scheduler's filter plus score), per GPU policy, beside a trivial
// baseline measured in the same run: a loop that only sums each GPU's
// free memory from the same NodeUsage. It reports ms per 5,000 nodes and
// the ratio to the baseline; the "-unscored" runs are Fit alone with
// FitOptions.Unscored, as a filter or a bind calls it.
func BenchmarkFit(b *testing.B) {
	const nodes = 5000
	invs, usages := benchCluster(nodes)
	req := vgputest.Pod("p").MemoryMiB(10240).Cores(20).PodRequest()
	baseline := func() int64 {
		var free int64
		for i := range invs {
			for _, g := range invs[i].GPUs {
				free += g.SchedulableMemoryMiB - usages[i].GPU(g.UUID).MemoryMiB
			}
		}
		return free
	}
	// hosts, when set, are the nodes' free CPU and memory, and the pod
	// asks for 4 CPUs and 16 GiB of them; summaries, when set, are the
	// nodes' NodeSummary, whose Fit is called instead of vgpu.Fit.
	run := func(b *testing.B, opts vgpu.FitOptions, hosts []vgpu.HostResources, summaries []*vgpu.NodeSummary) {
		pod := vgpu.PodDemand{Request: req}
		if hosts != nil {
			pod.Host = vgpu.HostResources{CPUMilli: 4000, MemoryMiB: 16384}
		}
		start := time.Now()
		rounds := 0
		for ; time.Since(start) < 50*time.Millisecond; rounds++ {
			baseline()
		}
		base := time.Since(start) / time.Duration(rounds)
		b.ResetTimer()
		for b.Loop() {
			for i := range invs {
				var p vgpu.Placement
				var err error
				if summaries != nil {
					p, err = summaries[i].Fit(pod, opts)
				} else {
					node := vgpu.NodeState{Inventory: invs[i], Usage: usages[i]}
					if hosts != nil {
						node.HostFree = &hosts[i]
					}
					p, err = vgpu.Fit(pod, node, opts)
				}
				if err == nil && !opts.Unscored {
					vgpu.Score(p)
				}
			}
		}
		per := b.Elapsed() / time.Duration(b.N)
		b.ReportMetric(float64(per.Microseconds())/1000, "ms/5000nodes")
		b.ReportMetric(float64(per)/float64(base), "x-baseline")
	}
	for _, policy := range vgpu.Policies() {
		opts := vgpu.FitOptions{NodePolicy: policy, GPUPolicy: policy, Workload: vgpu.DefaultWorkload()}
		b.Run(string(policy), func(b *testing.B) { run(b, opts, nil, nil) })
		// A filter's or a bind's call: the fit only (FitOptions.Unscored).
		opts.Unscored = true
		b.Run(string(policy)+"-unscored", func(b *testing.B) { run(b, opts, nil, nil) })
	}
	// The fragmentation policy against a workload a third of whose demand
	// is pinned to GPU models, weighed by the cluster's supply.
	opts := vgpu.FitOptions{NodePolicy: vgpu.PolicyFragmentation, GPUPolicy: vgpu.PolicyFragmentation, Workload: pinnedWorkload()}
	b.Run("fragmentation-pinned", func(b *testing.B) { run(b, opts, nil, nil) })
	// The fragmentation policy on nodes whose free CPU and memory are
	// known, against a workload whose pods ask for both: the host bound.
	// A node has 8 to 96 CPUs free, so the bound caps some classes.
	hosts := make([]vgpu.HostResources, nodes)
	for i := range hosts {
		hosts[i] = vgpu.HostResources{CPUMilli: int64(8000 * (1 + i%12)), MemoryMiB: int64(32768 * (1 + i%16))}
	}
	opts.Workload = hostWorkload()
	b.Run("fragmentation-host", func(b *testing.B) { run(b, opts, hosts, nil) })
	// The same from each node's NodeSummary, as the extender scores.
	summaries := make([]*vgpu.NodeSummary, nodes)
	for i := range summaries {
		summaries[i] = vgpu.Summarize(vgpu.NodeState{Inventory: invs[i], Usage: usages[i], HostFree: &hosts[i]}, opts.Workload)
	}
	b.Run("fragmentation-host-summary", func(b *testing.B) { run(b, opts, hosts, summaries) })
}

// hostWorkload is DefaultWorkload's classes with host requests: 8 CPUs
// and 32 GiB per whole GPU, 4 CPUs and 16 GiB per shared slice.
func hostWorkload() *vgpu.Workload {
	w := &vgpu.Workload{}
	for _, c := range vgpu.DefaultWorkload().Classes() {
		c.Host = vgpu.HostResources{CPUMilli: 4000, MemoryMiB: 16384}
		if c.Exclusive {
			c.Host = vgpu.HostResources{CPUMilli: 8000 * int64(c.GPUs), MemoryMiB: 32768 * int64(c.GPUs)}
		}
		w.AddClass(c)
	}
	return w
}

// pinnedWorkload is DefaultWorkload plus classes pinned to one of three
// models, with a supply of 40,000 GPUs of which the bench's nodes (model
// unset) are most.
func pinnedWorkload() *vgpu.Workload {
	w := vgpu.DefaultWorkload()
	for _, model := range []string{"T4", "A10", "V100"} {
		w.AddClass(vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 100, CoresPercent: 100, Exclusive: true, Models: []string{model}, Weight: 0.1})
		w.AddClass(vgpu.WorkloadClass{GPUs: 1, MemoryPercent: 50, Models: []string{model}, Weight: 0.05})
	}
	w.SetSupply(map[string]int{"": 34000, "T4": 3000, "A10": 2000, "V100": 1000})
	return w
}

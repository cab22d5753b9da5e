package simulate

import (
	"github.com/gpuslice/gpuslice/vgpu"
)

// onlineWorkload is the workload PolicyFragmentation starts a replay with:
// empty, forgetting with the half life given (0: DefaultHalfLife, below 0:
// never), and knowing the nodes' GPUs by model.
func onlineWorkload(nodes []Node, halfLife float64) *vgpu.Workload {
	w := &vgpu.Workload{}
	if halfLife == 0 {
		halfLife = DefaultHalfLife
	}
	w.SetHalfLife(halfLife)
	supply := map[string]int{}
	for _, n := range nodes {
		if n.GPUs > 0 {
			supply[n.Model] += n.GPUs
		}
	}
	w.SetSupply(supply)
	return w
}

// fgdWorkload is PolicyFGD's workload: every GPU task of the list, each
// weighing 1, under the paper's host rule.
func fgdWorkload(tasks []task) *vgpu.Workload {
	w := &vgpu.Workload{}
	w.SetHostFitOnly(true)
	for _, t := range tasks {
		for _, cr := range t.pod.Request.Containers {
			w.AddClass(vgpu.WorkloadClass{
				GPUs: cr.GPUs, MemoryPercent: cr.MemoryPercent, CoresPercent: cr.CoresPercent,
				Exclusive: cr.Exclusive, Models: t.pod.Constraints.Models, Host: t.pod.Host, Weight: 1,
			})
		}
	}
	return w
}

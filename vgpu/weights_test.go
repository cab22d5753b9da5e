package vgpu

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestFillWeightsRichHost checks fillWeights' shortcut for hosts that bound
// no class (Workload.feedsAll) against weighing every class one by one, as
// fillWeights does for other hosts: the same weights to the bit, for random
// workloads with and without host requests, random hosts and pods, and
// with the host rule of SetHostFitOnly. It also checks that the shortcut is
// taken, so the comparison is not vacuous.
func TestFillWeightsRichHost(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(11, 7))
	shortcuts := 0
	for round := range 400 {
		w := &Workload{}
		for range 1 + rng.IntN(12) {
			c := WorkloadClass{GPUs: 1 + rng.IntN(4), Weight: float64(1 + rng.IntN(9))}
			switch rng.IntN(3) {
			case 0:
				c.MemoryPercent, c.CoresPercent, c.Exclusive = MaxPercent, MaxPercent, true
			default:
				c.MemoryPercent = 10 * (1 + rng.IntN(9))
			}
			if rng.IntN(4) == 0 {
				c.GPUs = 0
			}
			if rng.IntN(3) > 0 {
				c.Host = HostResources{CPUMilli: int64(500 * rng.IntN(24)), MemoryMiB: int64(1024 * rng.IntN(96))}
			}
			w.AddClass(c)
		}
		w.SetHostFitOnly(rng.IntN(5) == 0)
		gpus := 1 + rng.IntN(8)
		free := HostResources{CPUMilli: int64(rng.IntN(200_000)), MemoryMiB: int64(rng.IntN(1 << 20))}
		pod := HostResources{CPUMilli: int64(rng.IntN(16_000)), MemoryMiB: int64(rng.IntN(65536))}
		for _, host := range []*HostResources{&free, nil} {
			n := len(w.shapes)
			got := [2]shapeWeights{{full: make([]float64, n)}, {full: make([]float64, n)}}
			w.fillWeights(host, pod, gpus, &got[0], &got[1])
			want := weighEach(w, host, pod, gpus)
			for k := range got {
				if !slices.Equal(got[k].full, want[k].full) || !slices.Equal(got[k].capped, want[k].capped) || got[k].stride != want[k].stride {
					t.Fatalf("round %d, host %v, side %d: fillWeights %+v, one class at a time %+v", round, host, k, got[k], want[k])
				}
			}
			if host == nil {
				continue
			}
			room := HostResources{CPUMilli: free.CPUMilli - pod.CPUMilli, MemoryMiB: free.MemoryMiB - pod.MemoryMiB}
			if w.feedsAll(free, w.hostFeeds(free), gpus) {
				shortcuts++
			}
			if w.feedsAll(room, w.hostFeeds(room), gpus) {
				shortcuts++
			}
		}
	}
	if shortcuts < 50 {
		t.Fatalf("the shortcut was taken %d times in 800 hosts; the test does not exercise it", shortcuts)
	}
	t.Logf("shortcut taken for %d of 800 hosts", shortcuts)
}

// weighEach is fillWeights without its shortcut: each class weighed by the
// host's bound on it.
func weighEach(w *Workload, hostFree *HostResources, pod HostResources, gpus int) [2]shapeWeights {
	n := len(w.shapes)
	out := [2]shapeWeights{{full: make([]float64, n)}, {full: make([]float64, n)}}
	var total float64
	for ci := range w.classes {
		total += w.classes[ci].Weight * w.scale[w.shapeOf[ci]]
	}
	if w.total <= 0 || total <= 0 {
		return out
	}
	var room HostResources
	var feedsBefore, feedsAfter float64
	if hostFree != nil {
		room = HostResources{CPUMilli: hostFree.CPUMilli - pod.CPUMilli, MemoryMiB: hostFree.MemoryMiB - pod.MemoryMiB}
		feedsBefore, feedsAfter = w.hostFeeds(*hostFree), w.hostFeeds(room)
	}
	for ci := range w.classes {
		c := &w.classes[ci]
		si := w.shapeOf[ci]
		share := c.Weight * w.scale[si] / total
		if hostFree == nil {
			out[0].full[si] += share
			out[1].full[si] += share
			continue
		}
		out[0].add(c, si, share, w.gpuBound(c, *hostFree, feedsBefore), gpus, n)
		out[1].add(c, si, share, w.gpuBound(c, room, feedsAfter), gpus, n)
	}
	return out
}

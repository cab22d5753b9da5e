package vgpu_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
)

// propertySeeds are the seeds of the randomized tests; a failure names its
// seed, and adding it here reproduces it.
var propertySeeds = []uint64{1, 2, 3, 4, 5, 6, 7, 8, 42, 1234}

func randomNode(rng *rand.Rand) vgpu.NodeInventory {
	n := vgpu.NodeInventory{Node: "n1", SplitCount: 1 + rng.IntN(6), MemoryScaling: 1}
	models := []string{"NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H100"}
	for i := range 1 + rng.IntN(8) {
		mem := int64(4096 * (1 + rng.IntN(8)))
		g := vgpu.GPU{
			UUID: fmt.Sprintf("GPU-%d", i), Index: i, Minor: i, Model: models[rng.IntN(len(models))],
			TotalMemoryMiB: mem, SchedulableMemoryMiB: mem - int64(rng.IntN(512)),
			CoresPercent: []int{100, 100, 80}[rng.IntN(3)], NUMANode: rng.IntN(2), Health: vgpu.Healthy,
		}
		if rng.IntN(8) == 0 {
			g.Health = vgpu.Unhealthy
		}
		n.GPUs = append(n.GPUs, g)
	}
	return n
}

func randomDemand(rng *rand.Rand, node vgpu.NodeInventory) vgpu.PodDemand {
	var req vgpu.PodRequest
	for i := range 1 + rng.IntN(3) {
		c := vgpu.ContainerRequest{Name: fmt.Sprintf("c%d", i), GPUs: 1 + rng.IntN(2)}
		switch rng.IntN(4) {
		case 0:
			c.Init = true
		case 1:
			c.Init, c.Sidecar = true, true
		}
		switch rng.IntN(5) {
		case 0:
			c.Exclusive, c.MemoryPercent, c.CoresPercent = true, 100, 100
		case 1:
			c.MemoryPercent = 1 + rng.IntN(100)
			c.CoresPercent = rng.IntN(101)
		default:
			c.MemoryMiB = int64(256 * (1 + rng.IntN(40)))
			c.CoresPercent = []int{0, 10, 25, 50}[rng.IntN(4)]
		}
		if rng.IntN(8) == 0 {
			c.UUIDs = []string{node.GPUs[rng.IntN(len(node.GPUs))].UUID, node.GPUs[rng.IntN(len(node.GPUs))].UUID}
		}
		req.Containers = append(req.Containers, c)
	}
	// Init containers come first, as RequestFromPod orders them.
	slices.SortStableFunc(req.Containers, func(a, b vgpu.ContainerRequest) int {
		switch {
		case a.Init == b.Init:
			return 0
		case a.Init:
			return -1
		}
		return 1
	})
	var c vgpu.Constraints
	if rng.IntN(4) == 0 {
		c.Models = []string{[]string{"a100", "T4"}[rng.IntN(2)]}
	}
	if rng.IntN(6) == 0 {
		c.ExcludeModels = []string{"h100"}
	}
	if rng.IntN(6) == 0 {
		c.ExcludeUUIDs = []string{node.GPUs[rng.IntN(len(node.GPUs))].UUID}
	}
	if rng.IntN(8) == 0 {
		c.UUIDs = []string{node.GPUs[rng.IntN(len(node.GPUs))].UUID, "GPU-7"}
	}
	c.NUMABind = rng.IntN(4) == 0
	c.GPUPolicy = []vgpu.Policy{"", vgpu.PolicyBinpack, vgpu.PolicySpread, vgpu.PolicyFragmentation, vgpu.PolicyFirstFit}[rng.IntN(5)]
	c.NodePolicy = c.GPUPolicy
	if c.NodePolicy == vgpu.PolicyFirstFit {
		c.NodePolicy = vgpu.PolicyFragmentation
	}
	return vgpu.PodDemand{Request: req, Constraints: c}
}

// TestFitProperties places random pods on random nodes until they stop
// fitting and checks, after every placement, that each GPU's pods fit its
// memory, compute and slices in every phase, independently of NodeUsage;
// that Fit is deterministic; and that every allocation validates and obeys
// health, filters and NUMA binding.
func TestFitProperties(t *testing.T) {
	t.Parallel()
	for _, seed := range propertySeeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 0))
			total, failed := 0, 0
			defer func() {
				// The generator must exercise both outcomes.
				if failed == 0 || failed == total {
					t.Errorf("%d of %d pods did not fit: the generator is off", failed, total)
				}
			}()
			for round := range 40 {
				node := randomNode(rng)
				usage := &vgpu.NodeUsage{}
				var placed []placedPod
				for range 30 {
					d := randomDemand(rng, node)
					state := vgpu.NodeState{Inventory: node, Usage: usage}
					p, err := vgpu.Fit(d, state, vgpu.FitOptions{})
					again, err2 := vgpu.Fit(d, vgpu.NodeState{Inventory: node, Usage: usage.Clone()}, vgpu.FitOptions{})
					if diff := cmp.Diff(p, again); diff != "" || fmt.Sprint(err) != fmt.Sprint(err2) {
						t.Fatalf("round %d: Fit is not deterministic (-first +second):\n%s\n%v\n%v", round, diff, err, err2)
					}
					total++
					if err != nil {
						failed++
						if !strings.Contains(err.Error(), ":") {
							t.Errorf("round %d: unspecific error %q", round, err)
						}
						continue
					}
					checkAllocation(t, node, d, p.Allocation)
					usage.Add(p.Allocation, d.Request)
					placed = append(placed, placedPod{d.Request, p.Allocation})
					checkCapacity(t, node, placed)
				}
				// Removing every pod leaves the node untouched.
				for _, pp := range placed {
					usage.Remove(pp.alloc, pp.req)
				}
				for _, g := range node.GPUs {
					if u := usage.GPU(g.UUID); u != (vgpu.GPUUsage{}) {
						t.Fatalf("round %d: %s holds %+v after every pod was removed", round, g.UUID, u)
					}
				}
			}
		})
	}
}

type placedPod struct {
	req   vgpu.PodRequest
	alloc vgpu.PodAllocation
}

func checkAllocation(t *testing.T, node vgpu.NodeInventory, d vgpu.PodDemand, a vgpu.PodAllocation) {
	t.Helper()
	if err := a.Validate(); err != nil {
		t.Fatalf("allocation %+v does not validate: %v", a, err)
	}
	if len(a.Containers) != len(d.Request.Containers) {
		t.Fatalf("allocation has %d containers, request %d", len(a.Containers), len(d.Request.Containers))
	}
	for i, c := range a.Containers {
		want := d.Request.Containers[i]
		if c.Name != want.Name || c.Init != want.Init || len(c.GPUs) != want.GPUs {
			t.Fatalf("container %d is %s/%v/%d GPUs, want %s/%v/%d", i, c.Name, c.Init, len(c.GPUs), want.Name, want.Init, want.GPUs)
		}
		numa := map[int]bool{}
		for _, s := range c.GPUs {
			g, ok := node.GPU(s.UUID)
			if !ok || g.Health != vgpu.Healthy {
				t.Fatalf("slice on unknown or unhealthy GPU %s", s.UUID)
			}
			numa[g.NUMANode] = true
			c := d.Constraints
			lower := strings.ToLower(g.Model)
			if len(c.Models) > 0 && !slices.ContainsFunc(c.Models, func(m string) bool { return strings.Contains(lower, strings.ToLower(m)) }) {
				t.Fatalf("GPU %s (%s) is not of model %v", g.UUID, g.Model, c.Models)
			}
			if slices.ContainsFunc(c.ExcludeModels, func(m string) bool { return strings.Contains(lower, strings.ToLower(m)) }) {
				t.Fatalf("GPU %s (%s) is of excluded model %v", g.UUID, g.Model, c.ExcludeModels)
			}
			if (len(c.UUIDs) > 0 && !slices.Contains(c.UUIDs, g.UUID)) || slices.Contains(c.ExcludeUUIDs, g.UUID) {
				t.Fatalf("GPU %s breaks the UUID filter %v / %v", g.UUID, c.UUIDs, c.ExcludeUUIDs)
			}
			if len(want.UUIDs) > 0 && !slices.Contains(want.UUIDs, g.UUID) {
				t.Fatalf("GPU %s is not one of container %s's %v", g.UUID, want.Name, want.UUIDs)
			}
			if want.CoresPercent != s.CoresPercent {
				t.Fatalf("slice cores %d, want %d", s.CoresPercent, want.CoresPercent)
			}
		}
		if d.Constraints.NUMABind && len(numa) > 1 {
			t.Fatalf("container %s spans NUMA nodes %v", c.Name, numa)
		}
	}
}

// checkCapacity recomputes, without NodeUsage, what each pod holds on each
// GPU in each of its phases and checks the sums against the GPU.
func checkCapacity(t *testing.T, node vgpu.NodeInventory, placed []placedPod) {
	t.Helper()
	for _, g := range node.GPUs {
		var mem int64
		var cores, slicesHeld, pods, exclusive int
		for _, pp := range placed {
			var pm int64
			var pc, ps int
			var touched, excl bool
			for _, phase := range podPhases(pp.req) {
				var m int64
				var c, s int
				for _, ci := range phase {
					for _, sl := range pp.alloc.Containers[ci].GPUs {
						if sl.UUID != g.UUID {
							continue
						}
						touched = true
						m, c, s = m+sl.MemoryMiB, c+sl.CoresPercent, s+1
						if pp.req.Containers[ci].Exclusive {
							excl = true
							if len(phase) > 1 && s > 1 {
								t.Fatalf("exclusive slice of %s shares a phase with another slice", g.UUID)
							}
						}
					}
				}
				pm, pc, ps = max(pm, m), max(pc, c), max(ps, s)
			}
			mem, cores, slicesHeld = mem+pm, cores+pc, slicesHeld+ps
			if touched {
				pods++
			}
			if excl {
				exclusive++
			}
		}
		if mem > g.SchedulableMemoryMiB || cores > g.CoresPercent || slicesHeld > node.SplitCount {
			t.Fatalf("%s holds %d MiB, %d%% cores, %d slices; it has %d MiB, %d%%, %d slices",
				g.UUID, mem, cores, slicesHeld, g.SchedulableMemoryMiB, g.CoresPercent, node.SplitCount)
		}
		if exclusive > 0 && pods > 1 {
			t.Fatalf("%s is held whole by a pod and shared with %d others", g.UUID, pods-1)
		}
	}
}

// podPhases lists, per phase, the containers that run together: each
// regular init container with the sidecars before it, then the app
// containers with all sidecars.
func podPhases(req vgpu.PodRequest) [][]int {
	var out [][]int
	var sidecars, apps []int
	for i, c := range req.Containers {
		switch {
		case c.Init && c.Sidecar:
			sidecars = append(sidecars, i)
		case c.Init:
			out = append(out, append(slices.Clone(sidecars), i))
		default:
			apps = append(apps, i)
		}
	}
	return append(out, append(sidecars, apps...))
}

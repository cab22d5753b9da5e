package simulate

import (
	"math/rand/v2"
	"testing"
)

// TestDRADeviceOrder checks the allocator's first fit under each device order on one node of two
// 16 GiB GPUs: 0.5 and 0.6 of a GPU land on GPU 0 and GPU 1; then 0.4 fits both, and by index
// it takes GPU 0, leaving 0.1 and 0.4 free, where a half GPU no longer fits; most used first it
// takes GPU 1 and leaves GPU 0's half free for it.
func TestDRADeviceOrder(t *testing.T) {
	t.Parallel()
	shares := []int64{500, 600, 400, 500}
	for _, tt := range []struct {
		order  DeviceOrder
		placed int
	}{{DeviceOrderIndex, 3}, {DeviceOrderUsed, 4}} {
		t.Run(string(tt.order), func(t *testing.T) {
			t.Parallel()
			mem := modelMemoryMiB("T4")
			node := draNode{cpu: 64000, mem: 1 << 20, cpuFree: 64000, memFree: 1 << 20}
			for range 2 {
				node.gpus = append(node.gpus, draGPU{model: "T4", memoryMiB: mem, memFreeMiB: mem, coresFree: 100})
			}
			cluster := []draNode{node}
			rng := rand.New(rand.NewPCG(1, 2))
			placed := 0
			for _, milli := range shares {
				if placeDRA(cluster, Task{CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, GPUMilli: milli}, tt.order, rng) {
					placed++
				}
			}
			if placed != tt.placed {
				t.Errorf("placed %d of %v, want %d", placed, shares, tt.placed)
			}
		})
	}
}

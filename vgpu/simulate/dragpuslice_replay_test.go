package simulate_test

import (
	"reflect"
	"testing"

	"github.com/gpuslice/gpuslice/vgpu/simulate"
)

// TestReplayDRAGpuslice checks that simulate.PolicyDRAGpuslice replays deterministically, packs the test
// trace at least as well as simulate.PolicyDRA, and takes devices in the order given.
func TestReplayDRAGpuslice(t *testing.T) {
	t.Parallel()
	nodes, tasks := readTestdata(t)
	replay := func(p simulate.Policy, order simulate.DeviceOrder) simulate.Result {
		res, err := simulate.Replay(nodes, tasks, simulate.Config{Policy: p, Seed: 42, DeviceOrder: order})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b := replay(simulate.PolicyDRAGpuslice, ""), replay(simulate.PolicyDRAGpuslice, simulate.DeviceOrderIndex)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("two replays of seed 42 differ: %+v and %+v", a, b)
	}
	if a.Placed == 0 || a.UnallocatedPercent < 0 || a.UnallocatedPercent > 100 {
		t.Errorf("test trace: %+v; want tasks placed and unallocated within 0-100%%", a)
	}
	if stock := replay(simulate.PolicyDRA, ""); a.UnallocatedPercent > stock.UnallocatedPercent {
		t.Errorf("dra-gpuslice leaves %.2f%% unallocated, stock DRA %.2f%%: want no worse", a.UnallocatedPercent, stock.UnallocatedPercent)
	}
	if _, err := simulate.ParseDeviceOrder("fullest"); err == nil {
		t.Error(`simulate.ParseDeviceOrder("fullest") accepted`)
	}
}

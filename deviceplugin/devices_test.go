package deviceplugin

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// testGPUs is a small mixed node: two A100s on NUMA 0/1 and a T4 without
// NUMA information.
func testGPUs() []vgpu.GPU {
	return []vgpu.GPU{
		{UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000001", Index: 1, Model: "NVIDIA A100-SXM4-80GB", TotalMemoryMiB: 81920, NUMANode: 1, Health: vgpu.Healthy},
		{UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000", Index: 0, Model: "NVIDIA A100-SXM4-80GB", TotalMemoryMiB: 81920, NUMANode: 0, Health: vgpu.Healthy},
		{UUID: "GPU-bbbbbbbb-0000-0000-0000-000000000002", Index: 2, Model: "Tesla T4", TotalMemoryMiB: 15360, NUMANode: -1, Health: vgpu.Healthy},
	}
}

func TestDeviceID(t *testing.T) {
	uuid := "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	id := DeviceID(uuid, 99)
	if len(id) > maxDeviceIDLength {
		t.Errorf("DeviceID length %d > %d", len(id), maxDeviceIDLength)
	}
	got, ok := GPUOfDeviceID(id)
	if !ok || got != uuid {
		t.Errorf("GPUOfDeviceID(%q) = %q, %v; want %q, true", id, got, ok, uuid)
	}
	for _, bad := range []string{"", "GPU-1", "::3", "GPU-1::x"} {
		if _, ok := GPUOfDeviceID(bad); ok {
			t.Errorf("GPUOfDeviceID(%q) accepted a foreign ID", bad)
		}
	}
}

func TestNewInventory(t *testing.T) {
	cfg := validConfig()
	cfg.SplitCount = 2
	cfg.ReservedMemoryMiB = 1024
	cfg.MemoryScaling = 1.5
	cfg.ExcludeGPUs = []string{"2"}
	inv, err := newInventory(cfg, testGPUs())
	if err != nil {
		t.Fatal(err)
	}
	node, _, _ := inv.snapshot()
	var got []string
	for _, g := range node.GPUs {
		got = append(got, g.UUID)
		if want := int64(float64(81920-1024) * 1.5); g.SchedulableMemoryMiB != want {
			t.Errorf("%s schedulable = %d MiB, want %d", g.UUID, g.SchedulableMemoryMiB, want)
		}
		if g.CoresPercent != 100 {
			t.Errorf("%s cores = %d, want 100", g.UUID, g.CoresPercent)
		}
	}
	want := []string{"GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-aaaaaaaa-0000-0000-0000-000000000001"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("advertised GPUs, sorted by index, T4 excluded (-want +got):\n%s", diff)
	}
	devs := pluginDevices(node)
	if len(devs) != 4 {
		t.Fatalf("got %d devices, want 2 GPUs x 2", len(devs))
	}
	if devs[2].GetTopology().GetNodes()[0].GetID() != 1 {
		t.Errorf("device %s lost its NUMA node", devs[2].GetID())
	}

	cfg.ReservedMemoryMiB = 90000
	if _, err := newInventory(cfg, testGPUs()); err == nil || !strings.Contains(err.Error(), "reservedMemoryMiB") {
		t.Errorf("reserve above GPU memory: err = %v, want one naming reservedMemoryMiB", err)
	}
}

func TestInventoryHealth(t *testing.T) {
	inv, err := newInventory(validConfig(), testGPUs())
	if err != nil {
		t.Fatal(err)
	}
	_, gen, changed := inv.snapshot()
	uuid := testGPUs()[2].UUID
	if !inv.setHealth(vgpu.HealthEvent{UUID: uuid, Health: vgpu.Unhealthy, Reason: "XID 79"}) {
		t.Fatal("setHealth reported no change")
	}
	select {
	case <-changed:
	default:
		t.Fatal("watchers were not woken")
	}
	node, gen2, _ := inv.snapshot()
	if gen2 != gen+1 {
		t.Errorf("generation %d -> %d, want +1", gen, gen2)
	}
	unhealthy := 0
	for _, d := range pluginDevices(node) {
		if d.GetHealth() != pluginapi.Healthy {
			unhealthy++
		}
	}
	if unhealthy != DefaultSplitCount {
		t.Errorf("%d unhealthy devices, want one GPU's worth (%d)", unhealthy, DefaultSplitCount)
	}
	if inv.setHealth(vgpu.HealthEvent{UUID: uuid, Health: vgpu.Unhealthy}) {
		t.Error("repeating the same health reported a change")
	}
	if inv.setHealth(vgpu.HealthEvent{UUID: "GPU-unknown", Health: vgpu.Unhealthy}) {
		t.Error("an unknown GPU changed the inventory")
	}
}

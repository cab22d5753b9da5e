package deviceplugin

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/vgpu"
)

// deviceIDSeparator joins a GPU UUID and a slice number in a virtual device
// ID: "GPU-8f0c…::3". UUIDs never contain "::".
const deviceIDSeparator = "::"

// DeviceID returns the virtual device ID of slice n of the GPU with uuid.
func DeviceID(uuid string, n int) string {
	return uuid + deviceIDSeparator + strconv.Itoa(n)
}

// GPUOfDeviceID returns the GPU UUID encoded in a virtual device ID, or false
// if id was not made by DeviceID.
func GPUOfDeviceID(id string) (string, bool) {
	uuid, _, ok := parseDeviceID(id)
	return uuid, ok
}

// parseDeviceID splits a DeviceID into GPU UUID and slice number.
func parseDeviceID(id string) (string, int, bool) {
	uuid, n, ok := strings.Cut(id, deviceIDSeparator)
	if !ok || uuid == "" {
		return "", 0, false
	}
	i, err := strconv.Atoi(n)
	if err != nil || i < 0 {
		return "", 0, false
	}
	return uuid, i, true
}

// inventory is the plugin's view of its GPUs. It is safe for concurrent use;
// every change bumps a generation and wakes the watchers (ListAndWatch
// streams and the publisher).
type inventory struct {
	mu         sync.Mutex
	node       vgpu.NodeInventory
	byUUID     map[string]int // index into node.GPUs
	changed    chan struct{}  // closed and replaced on every change
	generation uint64
}

// newInventory builds the advertised inventory from the backend's GPUs,
// dropping excluded ones and computing schedulable memory.
func newInventory(cfg Config, gpus []vgpu.GPU) (*inventory, error) {
	node := vgpu.NodeInventory{Node: cfg.NodeName, SplitCount: cfg.SplitCount, MemoryScaling: cfg.MemoryScaling}
	for _, g := range gpus {
		if cfg.excluded(g) {
			continue
		}
		if len(DeviceID(g.UUID, cfg.SplitCount-1)) > maxDeviceIDLength {
			return nil, fmt.Errorf("GPU %d: UUID %q is too long for a device ID (at most %d characters with the slice suffix)", g.Index, g.UUID, maxDeviceIDLength)
		}
		if g.TotalMemoryMiB <= cfg.ReservedMemoryMiB {
			return nil, fmt.Errorf("invalid config: reservedMemoryMiB=%d: must be below GPU %d's memory (%d MiB)", cfg.ReservedMemoryMiB, g.Index, g.TotalMemoryMiB)
		}
		g.SchedulableMemoryMiB = int64(float64(g.TotalMemoryMiB-cfg.ReservedMemoryMiB) * cfg.MemoryScaling)
		if g.CoresPercent == 0 {
			g.CoresPercent = 100
		}
		if g.Health == "" {
			g.Health = vgpu.Healthy
		}
		node.GPUs = append(node.GPUs, g)
	}
	slices.SortFunc(node.GPUs, func(a, b vgpu.GPU) int { return a.Index - b.Index })
	inv := &inventory{node: node, byUUID: map[string]int{}, changed: make(chan struct{})}
	for i, g := range node.GPUs {
		inv.byUUID[g.UUID] = i
	}
	return inv, nil
}

// snapshot returns a deep copy of the inventory, the generation it belongs to
// and a channel closed at the next change.
func (inv *inventory) snapshot() (vgpu.NodeInventory, uint64, <-chan struct{}) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	node := inv.node
	node.GPUs = slices.Clone(inv.node.GPUs)
	return node, inv.generation, inv.changed
}

// setHealth applies a health event; it reports whether anything changed.
// Events for unknown (e.g. excluded) GPUs are ignored.
func (inv *inventory) setHealth(ev vgpu.HealthEvent) bool {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	i, ok := inv.byUUID[ev.UUID]
	if !ok || inv.node.GPUs[i].Health == ev.Health {
		return false
	}
	inv.node.GPUs[i].Health = ev.Health
	inv.generation++
	close(inv.changed)
	inv.changed = make(chan struct{})
	return true
}

// gpu returns the GPU with uuid.
func (inv *inventory) gpu(uuid string) (vgpu.GPU, bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	i, ok := inv.byUUID[uuid]
	if !ok {
		return vgpu.GPU{}, false
	}
	return inv.node.GPUs[i], true
}

// pluginDevices returns the kubelet's view: SplitCount devices per GPU, with
// the GPU's health and NUMA topology.
func pluginDevices(node vgpu.NodeInventory) []*pluginapi.Device {
	devs := make([]*pluginapi.Device, 0, len(node.GPUs)*node.SplitCount)
	for _, g := range node.GPUs {
		health := pluginapi.Unhealthy
		if g.Health == vgpu.Healthy {
			health = pluginapi.Healthy
		}
		var topo *pluginapi.TopologyInfo
		if g.NUMANode >= 0 {
			topo = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMANode)}}}
		}
		for n := range node.SplitCount {
			devs = append(devs, &pluginapi.Device{ID: DeviceID(g.UUID, n), Health: health, Topology: topo})
		}
	}
	return devs
}

package drascore

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"sync"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/vgpu"
)

// celCacheSize bounds the compiled selector expressions kept: a cluster's claims name few
// distinct ones (the webhook writes one per model filter).
const celCacheSize = 1024

// State is what the DRA informers have told the extender: the DRA nodes' GPUs and what the
// allocated claims hold of them, the claims and the DeviceClasses. Its methods are safe for
// concurrent use: the informer handlers (Upsert*, Delete*) take its write lock, Score and the
// other reads its read lock, CountOnce and ForgetPod a lock of their own.
//
// Lock order: State's lock before the cluster state's. Score holds its read lock while it
// calls HostReader.ReadHosts, so code that holds the cluster state's lock never calls State.
type State struct {
	// mu guards the maps up to cel; cel, fit and hosts are set by New.
	mu sync.RWMutex
	// slices are the driver's node-local ResourceSlices by name.
	slices map[string]*draSlice
	// nodes are the DRA nodes by Node name: those with a slice of the driver.
	nodes map[string]*draNode
	// claims are every ResourceClaim by namespace/name; byPool the keys of those whose
	// allocation has a gpuslice device in a pool.
	claims map[string]*draClaim
	byPool map[string]map[string]struct{}
	// classes are the DeviceClasses' CEL selectors by class name.
	classes map[string][]string
	// cel compiles selectors once; safe for concurrent use.
	cel *cel.Cache
	// fit is the base of the options each node is fitted with; hosts reads the cluster state.
	fit   vgpu.FitOptions
	hosts HostReader

	// counted holds the pods the online workload counted (CountOnce), so that each counts
	// once; forgotten when the pod is deleted (ForgetPod).
	countedMu sync.Mutex
	counted   map[types.UID]struct{}
}

// draSlice is one ResourceSlice of the driver, on one node.
type draSlice struct {
	name, node, pool string
	generation       int64
	sliceCount       int64
	devices          []resourcev1.Device
}

// draNode is one DRA node: its GPUs as Fit reads them and what allocated claims hold there.
type draNode struct {
	name string
	// inv lists the node's devices in the allocator's order (pools by name, slices by name,
	// devices as listed), each a vgpu.GPU: a tainted device is Unhealthy, as the allocator
	// skips it; devices are by position in inv.GPUs.
	inv     vgpu.NodeInventory
	devices []cel.Device
	// pools are the node's complete pools; position maps "pool/device" to a position.
	pools    []string
	position map[string]int
	// usage is the allocated claims' consumption.
	usage vgpu.NodeUsage
	// matches caches, per CEL expression, whether each device matches it; reset when the
	// devices change. matchMu guards it: Score fills it under State's read lock.
	matchMu sync.Mutex
	matches map[string][]bool
}

// New returns an empty State whose Score fits each node with fit (its GPUPolicy, ReasonOnly,
// NoAllocation and Workload replaced: see Score) and reads the cluster state through hosts.
func New(fit vgpu.FitOptions, hosts HostReader) *State {
	return &State{
		slices:  map[string]*draSlice{},
		nodes:   map[string]*draNode{},
		claims:  map[string]*draClaim{},
		byPool:  map[string]map[string]struct{}{},
		classes: map[string][]string{},
		cel:     cel.NewCache(celCacheSize, cel.Features{EnableConsumableCapacity: true}),
		fit:     fit,
		hosts:   hosts,
		counted: map[types.UID]struct{}{},
	}
}

// TrimClaim keeps of a ResourceClaim what the State reads: identity, owners, requests and
// constraints (not their configuration), and the allocation's results (not its configuration,
// node selector or reservations). It is the claim informer's transform; c is not modified.
func TrimClaim(c *resourcev1.ResourceClaim) *resourcev1.ResourceClaim {
	out := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{
		Name: c.Name, Namespace: c.Namespace, UID: c.UID, ResourceVersion: c.ResourceVersion, OwnerReferences: c.OwnerReferences,
	}}
	out.Spec.Devices.Requests = c.Spec.Devices.Requests
	out.Spec.Devices.Constraints = c.Spec.Devices.Constraints
	if a := c.Status.Allocation; a != nil {
		out.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: a.Devices.Results}}
	}
	return out
}

// UpsertSlice records a slice added or updated and rebuilds the nodes it was and is on; a
// slice of another driver or of no node holds no GPUs.
func (d *State) UpsertSlice(sl *resourcev1.ResourceSlice) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var nodes []string
	if old := d.slices[sl.Name]; old != nil {
		nodes = append(nodes, old.node)
		delete(d.slices, sl.Name)
	}
	// Only node-local slices of the driver hold a node's GPUs.
	if sl.Spec.Driver == vgpu.DRADriverName && sl.Spec.NodeName != nil && *sl.Spec.NodeName != "" {
		n := &draSlice{
			name: sl.Name, node: *sl.Spec.NodeName, pool: sl.Spec.Pool.Name,
			generation: sl.Spec.Pool.Generation, sliceCount: sl.Spec.Pool.ResourceSliceCount, devices: sl.Spec.Devices,
		}
		d.slices[sl.Name] = n
		nodes = append(nodes, n.node)
	}
	for _, n := range nodes {
		d.rebuildLocked(n)
	}
}

// DeleteSlice records slice sl deleted.
func (d *State) DeleteSlice(sl *resourcev1.ResourceSlice) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if old := d.slices[sl.Name]; old != nil {
		delete(d.slices, sl.Name)
		d.rebuildLocked(old.node)
	}
}

// rebuildLocked builds node's GPUs from its slices, as the allocator orders them: pools by name,
// only a pool's newest generation and only complete pools (every one of its resourceSliceCount
// slices seen), slices by name. A node left without slices is dropped. Callers hold the write
// lock.
func (d *State) rebuildLocked(node string) {
	byPool := map[string][]*draSlice{}
	for _, sl := range d.slices {
		if sl.node == node {
			byPool[sl.pool] = append(byPool[sl.pool], sl)
		}
	}
	if len(byPool) == 0 {
		delete(d.nodes, node)
		return
	}
	n := &draNode{name: node, position: map[string]int{}, matches: map[string][]bool{},
		inv: vgpu.NodeInventory{Node: node, SplitCount: vgpu.DRASplitCount, MemoryScaling: 1}}
	pools := make([]string, 0, len(byPool))
	for p := range byPool {
		pools = append(pools, p)
	}
	slices.Sort(pools)
	for _, pool := range pools {
		list := byPool[pool]
		newest := slices.MaxFunc(list, func(a, b *draSlice) int { return cmp.Compare(a.generation, b.generation) }).generation
		list = slices.DeleteFunc(list, func(sl *draSlice) bool { return sl.generation != newest })
		if int64(len(list)) < list[0].sliceCount {
			continue // incomplete: the allocator skips it
		}
		slices.SortFunc(list, func(a, b *draSlice) int { return cmp.Compare(a.name, b.name) })
		n.pools = append(n.pools, pool)
		for _, sl := range list {
			for i := range sl.devices {
				n.addDevice(pool, &sl.devices[i])
			}
		}
	}
	d.nodes[node] = n
	d.usageLocked(n)
}

// addDevice appends dev of pool to n as a GPU: its uuid, model, index and NUMA attributes (the
// pool and device name stand in for a missing uuid) and its memory (MiB, rounded down) and
// cores capacities.
func (n *draNode) addDevice(pool string, dev *resourcev1.Device) {
	key := pool + "/" + dev.Name
	if _, dup := n.position[key]; dup {
		return
	}
	str := func(name string) string {
		if a, ok := dev.Attributes[resourcev1.QualifiedName(name)]; ok && a.StringValue != nil {
			return *a.StringValue
		}
		return ""
	}
	integer := func(name string, none int) int {
		if a, ok := dev.Attributes[resourcev1.QualifiedName(name)]; ok && a.IntValue != nil {
			return int(min(max(*a.IntValue, -1), 1<<30))
		}
		return none
	}
	g := vgpu.GPU{
		UUID: str(vgpu.DRAAttributeUUID), Model: str(vgpu.DRAAttributeModel), Index: integer(vgpu.DRAAttributeIndex, len(n.inv.GPUs)),
		NUMANode: integer(vgpu.DRAAttributeNUMANode, -1), Health: vgpu.Healthy,
	}
	if g.UUID == "" || slices.ContainsFunc(n.inv.GPUs, func(o vgpu.GPU) bool { return o.UUID == g.UUID }) {
		g.UUID = key
	}
	if c, ok := dev.Capacity[vgpu.DRACapacityMemory]; ok && c.Value.Sign() > 0 {
		g.SchedulableMemoryMiB = min(c.Value.Value()>>20, vgpu.MaxMemoryMiB)
		g.TotalMemoryMiB = g.SchedulableMemoryMiB
	}
	if c, ok := dev.Capacity[vgpu.DRACapacityCores]; ok && c.Value.Sign() > 0 {
		g.CoresPercent = int(min(c.Value.Value(), vgpu.MaxPercent))
	}
	for _, t := range dev.Taints {
		if t.Effect == resourcev1.DeviceTaintEffectNoSchedule || t.Effect == resourcev1.DeviceTaintEffectNoExecute {
			g.Health = vgpu.Unhealthy
		}
	}
	n.position[key] = len(n.inv.GPUs)
	n.inv.GPUs = append(n.inv.GPUs, g)
	n.devices = append(n.devices, cel.Device{Driver: vgpu.DRADriverName, AllowMultipleAllocations: dev.AllowMultipleAllocations, Attributes: dev.Attributes, Capacity: dev.Capacity})
}

// usageLocked recomputes what the allocated claims hold on n. Callers hold the write lock.
func (d *State) usageLocked(n *draNode) {
	n.usage = vgpu.NodeUsage{}
	seen := map[string]bool{}
	for _, pool := range n.pools {
		for key := range d.byPool[pool] {
			if seen[key] {
				continue
			}
			seen[key] = true
			alloc, req := n.allocationOf(d.claims[key])
			if len(alloc.Containers) > 0 {
				n.usage.Add(alloc, req)
			}
		}
	}
}

// allocationOf is what claim c holds on n, as a vgpu allocation of one container per result
// (req marks the results that took a whole device).
func (n *draNode) allocationOf(c *draClaim) (vgpu.PodAllocation, vgpu.PodRequest) {
	alloc := vgpu.PodAllocation{Node: n.name}
	var req vgpu.PodRequest
	for i, r := range c.results {
		pos, ok := n.position[r.pool+"/"+r.device]
		if !ok {
			continue
		}
		g := &n.inv.GPUs[pos]
		name := r.request + "#" + strconv.Itoa(i)
		s := vgpu.GPUSlice{UUID: g.UUID, MemoryMiB: r.memoryMiB, CoresPercent: r.cores}
		if s.MemoryMiB == 0 || r.whole {
			s.MemoryMiB = g.SchedulableMemoryMiB
		}
		if r.whole {
			s.CoresPercent = g.CoresPercent
			req.Containers = append(req.Containers, vgpu.ContainerRequest{Name: name, GPUs: 1, Exclusive: true})
		}
		alloc.Containers = append(alloc.Containers, vgpu.ContainerAllocation{Name: name, GPUs: []vgpu.GPUSlice{s}})
	}
	return alloc, req
}

// UpsertClaim records a claim added or updated and recomputes the usage of the nodes of the
// pools its allocation had and has.
func (d *State) UpsertClaim(claim *resourcev1.ResourceClaim) {
	c := draClaimOf(claim)
	key := claim.Namespace + "/" + claim.Name
	d.mu.Lock()
	defer d.mu.Unlock()
	d.replaceClaimLocked(key, c)
}

// DeleteClaim records claim deleted: what it held is free.
func (d *State) DeleteClaim(claim *resourcev1.ResourceClaim) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.replaceClaimLocked(claim.Namespace+"/"+claim.Name, nil)
}

// replaceClaimLocked puts c (nil: none) under key and recomputes the nodes whose usage changes.
func (d *State) replaceClaimLocked(key string, c *draClaim) {
	pools := map[string]bool{}
	if old := d.claims[key]; old != nil {
		for _, r := range old.results {
			pools[r.pool] = true
			delete(d.byPool[r.pool], key)
			if len(d.byPool[r.pool]) == 0 {
				delete(d.byPool, r.pool)
			}
		}
	}
	delete(d.claims, key)
	if c != nil {
		d.claims[key] = c
		for _, r := range c.results {
			pools[r.pool] = true
			if d.byPool[r.pool] == nil {
				d.byPool[r.pool] = map[string]struct{}{}
			}
			d.byPool[r.pool][key] = struct{}{}
		}
	}
	if len(pools) == 0 {
		return
	}
	for _, n := range d.nodes {
		if slices.ContainsFunc(n.pools, func(p string) bool { return pools[p] }) {
			d.usageLocked(n)
		}
	}
}

// UpsertClass records a DeviceClass's selectors.
func (d *State) UpsertClass(c *resourcev1.DeviceClass) {
	var exprs []string
	for _, s := range c.Spec.Selectors {
		if s.CEL != nil {
			exprs = append(exprs, s.CEL.Expression)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.classes[c.Name] = exprs
}

// DeleteClass records DeviceClass c deleted.
func (d *State) DeleteClass(c *resourcev1.DeviceClass) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.classes, c.Name)
}

// matchesLocked reports whether device pos of n matches expr, as the allocator evaluates it; an
// expression that does not compile or fails on the device matches nothing. Callers hold d's read
// lock.
func (d *State) matchesLocked(ctx context.Context, n *draNode, expr string, pos int) bool {
	n.matchMu.Lock()
	defer n.matchMu.Unlock()
	m, ok := n.matches[expr]
	if !ok {
		m = make([]bool, len(n.devices))
		compiled := d.cel.GetOrCompile(expr)
		for i := range n.devices {
			if compiled.Error == nil {
				match, _, err := compiled.DeviceMatches(ctx, n.devices[i])
				m[i] = err == nil && match
			}
		}
		if compiled.Error != nil {
			klog.FromContext(ctx).V(4).Info("DRA selector does not compile; it matches no device", "expression", expr, "err", compiled.Error.Error())
		}
		n.matches[expr] = m
	}
	return m[pos]
}

// Supply returns the DRA nodes' healthy GPUs by model, for the workload's supply.
func (d *State) Supply() map[string]int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := map[string]int{}
	for _, n := range d.nodes {
		for _, g := range n.inv.GPUs {
			if g.Health == vgpu.Healthy {
				out[g.Model]++
			}
		}
	}
	return out
}

// NodeUsage returns a copy of what the allocated claims hold on DRA node node; empty for a node
// that is none.
func (d *State) NodeUsage(node string) *vgpu.NodeUsage {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if n := d.nodes[node]; n != nil {
		return n.usage.Clone()
	}
	return &vgpu.NodeUsage{}
}

// CountOnce reports whether pod uid was not counted into the online workload yet, and records
// it counted.
func (d *State) CountOnce(uid types.UID) bool {
	d.countedMu.Lock()
	defer d.countedMu.Unlock()
	if _, ok := d.counted[uid]; ok {
		return false
	}
	d.counted[uid] = struct{}{}
	return true
}

// ForgetPod forgets that pod uid was counted (CountOnce): the pod was deleted.
func (d *State) ForgetPod(uid types.UID) {
	d.countedMu.Lock()
	defer d.countedMu.Unlock()
	delete(d.counted, uid)
}

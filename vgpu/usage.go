package vgpu

// GPUUsage is what the pods placed on a node hold on one GPU, each pod
// counted at its peak (see NodeUsage). The zero value is an untouched GPU.
type GPUUsage struct {
	// MemoryMiB is the memory held by slices.
	MemoryMiB int64
	// CoresPercent is the compute reserved by slices; best-effort slices
	// (0) add nothing.
	CoresPercent int
	// Slices is how many slices (containers) the GPU holds.
	Slices int
	// Exclusive is how many whole-GPU (exclusive) containers hold the GPU;
	// above 0 means no slice is free whatever the split count.
	Exclusive int
}

func (u GPUUsage) add(v GPUUsage, sign int) GPUUsage {
	u.MemoryMiB += int64(sign) * v.MemoryMiB
	u.CoresPercent += sign * v.CoresPercent
	u.Slices += sign * v.Slices
	u.Exclusive += sign * v.Exclusive
	return u
}

func (u GPUUsage) max(v GPUUsage) GPUUsage {
	return GPUUsage{
		MemoryMiB:    max(u.MemoryMiB, v.MemoryMiB),
		CoresPercent: max(u.CoresPercent, v.CoresPercent),
		Slices:       max(u.Slices, v.Slices),
		Exclusive:    max(u.Exclusive, v.Exclusive),
	}
}

// NodeUsage is what the pods placed on one node hold, per GPU UUID. The
// scheduler extender keeps one per node and updates it as pods come and go
// (Add, Remove), so Fit never recomputes it from every allocation. The zero
// value is a node with nothing placed; a nil *NodeUsage reads the same. It
// is not safe for concurrent use: callers that share one lock it or copy it
// (Clone).
//
// How a pod is counted on each GPU. A pod's containers run in phases, as the
// kubelet runs them: each regular init container runs alone, after the
// sidecars (restartable init containers) declared before it have started,
// and its resources are reused afterwards; then the app containers run with
// all sidecars. A pod therefore holds, on each GPU and for each of memory,
// cores, slices and exclusivity separately, the maximum over its phases of
// the sum of its containers' slices in that phase: the max of its init-phase
// use and its app-phase use. Phases of different pods are not assumed to
// interleave in any helpful way, so pods add up. This is exact for one pod
// (every phase fits if and only if the per-GPU maxima fit) and conservative
// across pods.
type NodeUsage struct {
	gpus map[string]GPUUsage
}

// Add counts a pod placed on the node: a is its allocation and req its
// request (RequestFromPod), used only to tell sidecars from regular init
// containers and to find exclusive containers, matched by container name.
// With a zero req every init container is counted as a sidecar and no
// container as exclusive: safe (never counts less than the pod can hold at
// once) but it may count regular init containers twice. Remove with the
// same arguments undoes Add exactly.
func (u *NodeUsage) Add(a PodAllocation, req PodRequest) {
	u.apply(a, req, 1)
}

// Remove undoes an Add with the same a and req. Removing what was never
// added makes the usage meaningless; callers keep the pair they added.
func (u *NodeUsage) Remove(a PodAllocation, req PodRequest) {
	u.apply(a, req, -1)
}

// GPU returns the usage of the GPU with this UUID; an unknown UUID is
// untouched.
func (u *NodeUsage) GPU(uuid string) GPUUsage {
	if u == nil {
		return GPUUsage{}
	}
	return u.gpus[uuid]
}

// Clone returns a copy that shares nothing with u.
func (u *NodeUsage) Clone() *NodeUsage {
	c := &NodeUsage{}
	if u == nil || len(u.gpus) == 0 {
		return c
	}
	c.gpus = make(map[string]GPUUsage, len(u.gpus))
	for k, v := range u.gpus {
		c.gpus[k] = v
	}
	return c
}

func (u *NodeUsage) apply(a PodAllocation, req PodRequest, sign int) {
	for uuid, fp := range footprint(a, req) {
		if u.gpus == nil {
			u.gpus = map[string]GPUUsage{}
		}
		n := u.gpus[uuid].add(fp, sign)
		if n == (GPUUsage{}) {
			delete(u.gpus, uuid)
		} else {
			u.gpus[uuid] = n
		}
	}
}

// footprint returns what the pod holds on each GPU (see NodeUsage).
func footprint(a PodAllocation, req PodRequest) map[string]GPUUsage {
	kinds := make([]ContainerRequest, len(a.Containers))
	for i, c := range a.Containers {
		kinds[i] = ContainerRequest{Name: c.Name, Init: c.Init, Sidecar: c.Init}
		for _, r := range req.Containers {
			if r.Name == c.Name && r.Init == c.Init {
				kinds[i].Sidecar, kinds[i].Exclusive = r.Sidecar, r.Exclusive
				break
			}
		}
	}
	ph := newPhases(kinds, nil)
	perPhase := map[string][]GPUUsage{}
	for i, c := range a.Containers {
		for _, s := range c.GPUs {
			uses := perPhase[s.UUID]
			if uses == nil {
				uses = make([]GPUUsage, ph.count)
				perPhase[s.UUID] = uses
			}
			use := GPUUsage{MemoryMiB: s.MemoryMiB, CoresPercent: s.CoresPercent, Slices: 1}
			if kinds[i].Exclusive {
				use.Exclusive = 1
			}
			for p := range ph.count {
				if ph.in(i, p) {
					uses[p] = uses[p].add(use, 1)
				}
			}
		}
	}
	out := make(map[string]GPUUsage, len(perPhase))
	for uuid, uses := range perPhase {
		var peak GPUUsage
		for _, x := range uses {
			peak = peak.max(x)
		}
		out[uuid] = peak
	}
	return out
}

// maxPhases bounds the phases tracked per pod. Regular init containers past
// the 63rd share the last init phase, which counts them together: more, never
// less, than they hold.
const maxPhases = 64

// phases says in which phases each container of a pod runs. Phase 0..count-2
// are the regular init containers in order; phase count-1 is the app phase.
type phases struct {
	count int
	masks []uint64
}

// newPhases computes the phases of cs, keeping the masks in buf when it has
// room.
func newPhases(cs []ContainerRequest, buf []uint64) phases {
	regular := 0
	for _, c := range cs {
		if c.Init && !c.Sidecar {
			regular++
		}
	}
	count := min(regular, maxPhases-1) + 1
	app := count - 1
	masks := buf[:0]
	if cap(masks) < len(cs) {
		masks = make([]uint64, 0, len(cs))
	}
	ph := phases{count: count, masks: masks[:len(cs)]}
	r := 0
	for i, c := range cs {
		switch {
		case !c.Init:
			ph.masks[i] = 1 << app
		case !c.Sidecar:
			ph.masks[i] = 1 << min(r, app-1)
			r++
		default:
			// A sidecar runs from its position on: in every later regular
			// init phase and in the app phase.
			var m uint64 = 1 << app
			for p := min(r, app); p < app; p++ {
				m |= 1 << p
			}
			ph.masks[i] = m
		}
	}
	return ph
}

func (ph phases) in(container, phase int) bool {
	return ph.masks[container]&(1<<phase) != 0
}

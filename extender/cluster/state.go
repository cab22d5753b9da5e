package cluster

import (
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/vgpu"
)

// State is what the informers have told the extender, kept parsed so
// that Filter and Prioritize read it without decoding anything, and the
// judging of pods on it. All fields are guarded by mu, which no code
// outside this package can take: informer handlers (Upsert*, Delete*) and
// reservations (Reserve) write under the write lock; the judges (Judge,
// JudgeAll, JudgeBest, Judging) and the views read under the read lock
// and never copy it. Its methods are safe for concurrent use.
type State struct {
	mu   sync.RWMutex
	opts Options
	// resourceName is the extended resource whose allocatable is checked.
	resourceName corev1.ResourceName
	// nodes by Node name. An entry is created by the first Node or pod
	// event that names it and never removed, so pointers stay valid: a
	// deleted Node is marked unknown and keeps the usage of pods that
	// still name it.
	nodes map[string]*nodeState
	// byIndex are the nodes by nodeState.index, byLease by the name of
	// their heartbeat Lease.
	byIndex []*nodeState
	byLease map[string]*nodeState
	// known counts the nodes whose Node object exists.
	known int
	// pods holds every pod counted in some node's usage, by UID.
	pods map[types.UID]*Entry
	// hosts holds what every bound, running pod takes of its node's CPU
	// and memory, by UID, GPU pod or not.
	hosts map[types.UID]hostEntry
	// leases are the heartbeat Leases by name.
	leases map[string]*leaseState

	// listener hears of every change that may let a pod Filter turned
	// away fit now, timed by now.
	listener ChangeListener
	now      func() time.Time
	// bindLocks are the per-node locks of Reserve.
	bindLocks keyedMutex
	// workload is what Fit measures fragmentation against, and node
	// summaries are measured against it; SetWorkload replaces it with a
	// new snapshot of the online workload. Never modified.
	workload *vgpu.Workload
}

// ChangeListener hears of the state's changes that may let a pod Filter
// turned away fit now (retry.Tracker is the extender's). Nodes are named
// by their index (Verdict.Node); at is when the state saw the change.
// Called under the state's write lock or without it; must not call back
// into the state.
type ChangeListener interface {
	// NodeReady: the node's plugin became ready (label, allocatable,
	// heartbeat back, registered again), or the node became known.
	NodeReady(at time.Time, node int)
	// InventoryChanged: the node's GPU inventory changed.
	InventoryChanged(at time.Time, node int)
	// Freed: a pod counted on the node went, freeing what it held.
	Freed(at time.Time, node int)
	// Synced: the informers' first lists are counted, so any pod may fit
	// anywhere now.
	Synced(at time.Time)
	// Forget: the pod is bound, terminal or deleted; it waits no more.
	Forget(uid types.UID)
}

// ignoreChanges is the ChangeListener of a state nobody listens to.
type ignoreChanges struct{}

func (ignoreChanges) NodeReady(time.Time, int)        {}
func (ignoreChanges) InventoryChanged(time.Time, int) {}
func (ignoreChanges) Freed(time.Time, int)            {}
func (ignoreChanges) Synced(time.Time)                {}
func (ignoreChanges) Forget(types.UID)                {}

// nodeState is one node as the extender sees it.
type nodeState struct {
	// First what judging a node for a pod reads, side by side.
	//
	// known is true while the Node object exists.
	known bool
	// heartbeatFine is true while the node's heartbeat Lease exists, has
	// a renewTime and a heartbeat (if any) that parses and says the plugin
	// is registered: all HeartbeatReadiness asks but the age, judged on
	// each Lease event; heartbeatRenewed is its renewTime.
	heartbeatFine    bool
	heartbeatRenewed time.Time
	// readiness is what the Node's own fields (inventory, ready label,
	// allocatable resourceName) say of its device plugin
	// (vgpu.NodeReadiness), judged on each Node event, so that Filter
	// neither re-parses the label nor re-formats its messages for every
	// candidate node; ready when they admit pods. The heartbeat is judged
	// at each Filter, as it ages (readinessLocked).
	readiness vgpu.Readiness
	// summary is inventory and usage laid out for Fit, rebuilt whenever
	// either changes (refreshLocked).
	summary *vgpu.NodeSummary
	// summaryWorkload is the workload summary was measured against; while
	// it is not State.workload, the summary's fragmentation figures
	// and the verdicts are stale (SetWorkload).
	summaryWorkload *vgpu.Workload
	// gen changes whenever usage or inventory changes, so a bind can tell
	// whether what it checked under the read lock is still current, and
	// verdicts can tell whether they still hold.
	gen uint64
	// figures are summary's, copied here: Filter screens every node with
	// them (Reject, ScoreBound) and reads a summary only for the nodes
	// they leave undecided. Summaries are rebuilt all over the heap as
	// pods come and go; the node states stay side by side.
	figures vgpu.NodeFigures
	// index is the node's position in State.byIndex.
	index int
	// name is the Node's name.
	name string
	// verdicts remembers the latest Fit verdicts for a few pod shapes.
	verdicts verdictCache
	// leaseName is vgpu.HeartbeatLeaseName of the node's name, computed
	// once; lease is that Lease's state while it exists, so Filter finds
	// it without a lookup.
	leaseName string
	lease     *leaseState
	// hasInventory and inventoryHash are NodeMeta's: whether the Node has
	// the inventory annotation and which value inventory and inventoryErr
	// were parsed from; parsing happens only when it changes.
	hasInventory  bool
	inventoryHash uint64
	inventory     vgpu.NodeInventory
	inventoryErr  error
	// usage is what the counted pods (bound and reserved) hold.
	usage vgpu.NodeUsage
	// hostAllocatable is the Node's allocatable CPU and memory (nil:
	// unknown); hostRequested what its pods request of them. The summary
	// is given the difference (hostFreeLocked).
	hostAllocatable *vgpu.HostResources
	hostRequested   vgpu.HostResources
	// registered is the Node's vgpu.ConditionRegistered (status and
	// reason only), nil when it has none; allocatable is its allocatable
	// resourceName. The node-condition controller reads both.
	registered  *corev1.NodeCondition
	allocatable int64
	// kubeletReady is true while the Node's Ready condition is True.
	kubeletReady bool
}

// Entry is one pod counted in a node's usage.
type Entry struct {
	uid  types.UID
	node string
	// raw is the allocation annotation value alloc was parsed from.
	raw   string
	alloc vgpu.PodAllocation
	req   vgpu.PodRequest
	// reserved is true from Bind's reservation until the informer sees the
	// pod bound with this allocation; then the entry counts as bound.
	reserved bool
}

// UID is the pod's.
func (e *Entry) UID() types.UID { return e.uid }

// Node is the node the pod counts on.
func (e *Entry) Node() string { return e.node }

// Raw is the allocation annotation value Allocation was parsed from (or
// encoded to, for a reservation).
func (e *Entry) Raw() string { return e.raw }

// Allocation is what the pod holds on Node.
func (e *Entry) Allocation() vgpu.PodAllocation { return e.alloc }

// Terminal reports whether a pod in phase holds nothing on its node any
// more.
func Terminal(phase corev1.PodPhase) bool {
	return phase == corev1.PodSucceeded || phase == corev1.PodFailed
}

// leaseState is a heartbeat Lease as the extender needs it.
type leaseState struct {
	renewTime time.Time // zero when the Lease has no renewTime
	// raw is the heartbeat annotation value; heartbeat and heartbeatErr
	// were parsed from it, only when it changed.
	raw          string
	heartbeat    vgpu.PluginHeartbeat
	heartbeatErr error
}

// Options are what a State judges by.
type Options struct {
	// ResourceName is the extended resource whose allocatable a node must
	// have (vgpu.NodeReadiness).
	ResourceName corev1.ResourceName
	// Now is the clock: heartbeat age, change times. Required.
	Now func() time.Time
	// HeartbeatMaxAge is the oldest a heartbeat may be (vgpu.PluginReadiness);
	// a Lease renewed after a longer gap is a change. HeartbeatNamespace is
	// the Leases' namespace, for messages.
	HeartbeatMaxAge    time.Duration
	HeartbeatNamespace string
	// Fit are the policies pods are fitted by (NodePolicy, GPUPolicy);
	// the state sets the rest of each call's options.
	Fit vgpu.FitOptions
	// PercentageOfNodesToScore is kube-scheduler's profile setting
	// (FitsElsewhere).
	PercentageOfNodesToScore int
	// Workload is what the summaries are measured against until
	// SetWorkload replaces it. Required; never modified.
	Workload *vgpu.Workload
	// Listener hears of the state's changes; nil: nobody.
	Listener ChangeListener
	// ExtraSupply, when set, adds GPUs by model that no Node inventory
	// lists (the DRA nodes') to a new workload's supply (SetWorkload); it
	// must not call into the state.
	ExtraSupply func() map[string]int
}

// New returns an empty state judging by opts.
func New(opts Options) *State {
	st := &State{
		opts:         opts,
		workload:     opts.Workload,
		resourceName: opts.ResourceName,
		nodes:        map[string]*nodeState{},
		byLease:      map[string]*nodeState{},
		pods:         map[types.UID]*Entry{},
		hosts:        map[types.UID]hostEntry{},
		leases:       map[string]*leaseState{},
		listener:     opts.Listener,
		now:          opts.Now,
	}
	if st.listener == nil {
		st.listener = ignoreChanges{}
	}
	return st
}

// nodeLocked returns the state of node name, creating it. Callers hold the
// write lock.
func (st *State) nodeLocked(name string) *nodeState {
	n := st.nodes[name]
	if n == nil {
		n = &nodeState{name: name, index: len(st.byIndex), leaseName: vgpu.HeartbeatLeaseName(name)}
		st.nodes[name] = n
		st.byIndex = append(st.byIndex, n)
		st.byLease[n.leaseName] = n
		n.lease = st.leases[n.leaseName] // a Lease seen before its Node
		n.syncHeartbeat()
	}
	return n
}

// UpsertNode records a Node added or updated, as the Node cache keeps it
// (NodeMetaOf, with the state's parses reused).
func (st *State) UpsertNode(node *corev1.Node) {
	st.UpsertNodeMeta(NodeMetaOf(node, st.resourceName, st.ParsedInventory))
}

// UpsertNodeMeta records a Node added or updated, as the Node cache keeps
// it.
func (st *State) UpsertNodeMeta(m *NodeMeta) {
	st.mu.Lock()
	defer st.mu.Unlock()
	n := st.nodeLocked(m.Name)
	wasReady := n.known && n.readiness.Ready()
	inventoryChanged := n.hasInventory != m.HasInventory || n.inventoryHash != m.InventoryHash
	if !n.known {
		st.known++
	}
	n.known = true
	n.hasInventory, n.inventoryHash, n.inventory, n.inventoryErr = m.HasInventory, m.InventoryHash, m.Inventory, m.InventoryErr
	alloc := m.HostAllocatable
	hostChanged := (alloc == nil) != (n.hostAllocatable == nil) || alloc != nil && *alloc != *n.hostAllocatable
	n.hostAllocatable = alloc
	if n.summary == nil || inventoryChanged || hostChanged {
		st.refreshLocked(n)
	}
	n.allocatable = m.Allocatable
	n.registered, n.kubeletReady = m.Registered, m.KubeletReady
	n.readiness = vgpu.NodeReadiness(n.inventoryErr, m.ReadyLabel, m.HasReadyLabel, m.Allocatable, st.resourceName)
	switch {
	case !n.readiness.Ready():
	case inventoryChanged:
		st.listener.InventoryChanged(st.now(), n.index)
	case !wasReady:
		st.listener.NodeReady(st.now(), n.index)
	}
}

// Synced records that the informers' first lists are counted: every pod
// Filter turned away before may fit now, anywhere.
func (st *State) Synced() {
	st.listener.Synced(st.now())
}

// DeleteNode records a Node deleted. Its usage stays until its pods go.
func (st *State) DeleteNode(name string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	n := st.nodes[name]
	if n == nil || !n.known {
		return
	}
	st.known--
	n.known = false
	n.hasInventory, n.inventoryHash, n.inventory, n.inventoryErr = false, 0, vgpu.NodeInventory{}, vgpu.ErrNoInventory
	st.refreshLocked(n)
	n.readiness = vgpu.NodeReadiness(vgpu.ErrNoInventory, "", false, 0, st.resourceName)
}

// UpsertLease records a heartbeat Lease added or updated. Other Leases in
// the namespace (the kubelets' node Leases in the default one) are
// ignored: no node's leaseName can match them.
func (st *State) UpsertLease(lease *coordinationv1.Lease) {
	if !vgpu.IsHeartbeatLeaseName(lease.Name) {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	l := st.leases[lease.Name]
	if l == nil {
		l = &leaseState{}
		st.leases[lease.Name] = l
		if n := st.byLease[lease.Name]; n != nil {
			n.lease = l
		}
	}
	lastRenew := l.renewTime
	l.renewTime = time.Time{}
	if lease.Spec.RenewTime != nil {
		l.renewTime = lease.Spec.RenewTime.Time
	}
	raw := lease.Annotations[vgpu.AnnotationPluginHeartbeat]
	// A new Lease, a new registration state, or a renewal after a gap long
	// enough for Filter to have judged the heartbeat stale: between the
	// two renewals, or (clocks differ, watches lag) by the extender's own
	// clock, which Filter uses.
	// A Lease whose Node is not known yet changes nothing: the Node's
	// arrival will.
	if n := st.byLease[lease.Name]; n != nil && (raw != l.raw || !l.renewTime.IsZero() && (lastRenew.IsZero() ||
		l.renewTime.Sub(lastRenew) > st.opts.HeartbeatMaxAge || st.now().Sub(lastRenew) > st.opts.HeartbeatMaxAge)) {
		st.listener.NodeReady(st.now(), n.index)
	}
	if raw != l.raw {
		l.raw = raw
		l.heartbeat, l.heartbeatErr = vgpu.PluginHeartbeat{}, nil
		if raw != "" {
			l.heartbeat, l.heartbeatErr = vgpu.ParsePluginHeartbeat(raw)
		}
	}
	if n := st.byLease[lease.Name]; n != nil {
		n.syncHeartbeat()
	}
}

// syncHeartbeat copies what readinessLocked reads of n's Lease into n.
func (n *nodeState) syncHeartbeat() {
	h := n.heartbeat()
	// Judged at its own renewal, a heartbeat is as fresh as any limit
	// asks: the rest of HeartbeatReadiness is what stays to judge.
	n.heartbeatFine = vgpu.HeartbeatReadiness(h, h.RenewTime, 0, "").Ready()
	n.heartbeatRenewed = h.RenewTime
}

// heartbeat is n's heartbeat Lease as vgpu.HeartbeatReadiness reads it.
func (n *nodeState) heartbeat() vgpu.Heartbeat {
	l := n.lease
	if l == nil {
		return vgpu.Heartbeat{}
	}
	return vgpu.Heartbeat{Exists: true, RenewTime: l.renewTime, Raw: l.raw, Parsed: l.heartbeat, Err: l.heartbeatErr}
}

// DeleteLease records a heartbeat Lease deleted.
func (st *State) DeleteLease(name string) {
	if !vgpu.IsHeartbeatLeaseName(name) {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.leases, name)
	if n := st.byLease[name]; n != nil {
		n.lease = nil
		n.syncHeartbeat()
	}
}

// UpsertPod records a pod added or updated. A pod counts when it is not
// terminal, is bound (spec.nodeName) and carries a valid allocation for
// that node; a reservation made by Bind keeps counting while the pod is
// still unbound. It returns an error to log when the pod carries an
// allocation that is not counted because it is malformed.
func (st *State) UpsertPod(pod *corev1.Pod) error {
	terminal := Terminal(pod.Status.Phase)
	st.upsertHost(pod.UID, pod.Spec.NodeName, terminal, vgpu.HostRequestOf(pod))
	return st.upsertGPU(pod, terminal)
}

// UpsertPlainPod records a pod added or updated that asks for no GPU and
// carries no allocation, as the pod cache keeps it: what it takes of its
// node's CPU and memory (host) while it is bound there (node) and not
// terminal, and no GPU usage (an update that removed a pod's allocation
// must still remove what it counted).
func (st *State) UpsertPlainPod(uid types.UID, node string, terminal bool, host vgpu.HostResources) {
	st.upsertHost(uid, node, terminal, host)
	_ = st.upsertGPU(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid}}, terminal) // no allocation: cannot fail
}

// upsertGPU is UpsertPod's GPU usage: pod counts or stops counting on its
// node, as UpsertPod says.
func (st *State) upsertGPU(pod *corev1.Pod, terminal bool) error {
	raw, hasAlloc := pod.Annotations[vgpu.AnnotationPodAllocation]
	node := pod.Spec.NodeName
	if terminal || node != "" {
		st.listener.Forget(pod.UID)
	}
	if st.podUnchanged(pod.UID, terminal || node == "" || !hasAlloc, node, raw) {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	old := st.pods[pod.UID]
	switch {
	case terminal:
		st.removeLocked(old)
		return nil
	case node == "":
		// Unbound: only Bind's own reservation counts, until it is
		// confirmed or released.
		if old != nil && !old.reserved {
			st.removeLocked(old)
		}
		return nil
	case !hasAlloc:
		st.removeLocked(old)
		return nil
	case old != nil && old.node == node && old.raw == raw:
		old.reserved = false // bound as reserved: same usage
		return nil
	}
	st.removeLocked(old)
	alloc, err := vgpu.ParsePodAllocation(raw)
	if err != nil {
		return err
	}
	if alloc.Node != node {
		return fmt.Errorf("%s names node %q but the pod is bound to %q", vgpu.AnnotationPodAllocation, alloc.Node, node)
	}
	// The request tells sidecars from regular init containers; a pod spec
	// vgpu rejects counts with the safe zero request (see NodeUsage.Add).
	req, _ := vgpu.RequestFromPod(pod)
	st.addLocked(&Entry{
		uid:  pod.UID,
		node: node, raw: raw, alloc: alloc, req: req,
	})
	return nil
}

// podUnchanged reports, under the read lock, whether a pod event leaves the
// state as it is: a pod that is not counted and does not start counting
// (uncountable: terminal, unbound or without allocation), or a bound pod
// counted already with this node and allocation. Most pod events in a
// cluster are such, and the informer then takes no write lock that would
// hold up Filter. Anything else UpsertPod decides under the write lock.
func (st *State) podUnchanged(uid types.UID, uncountable bool, node, raw string) bool {
	st.mu.RLock()
	defer st.mu.RUnlock()
	old := st.pods[uid]
	if old == nil {
		return uncountable
	}
	return !uncountable && !old.reserved && old.node == node && old.raw == raw
}

// DeletePod records a pod deleted: whatever it held, bound or reserved, is
// free again.
func (st *State) DeletePod(uid types.UID) {
	st.listener.Forget(uid)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.removeLocked(st.pods[uid])
	st.setHostLocked(uid, hostEntry{}, false)
}

// addLocked counts e on its node. Callers hold the write lock.
func (st *State) addLocked(e *Entry) {
	n := st.nodeLocked(e.node)
	n.usage.Add(e.alloc, e.req)
	st.refreshLocked(n)
	st.pods[e.uid] = e
}

// removeLocked stops counting e, if it is still counted. Callers hold the
// write lock.
func (st *State) removeLocked(e *Entry) {
	if e == nil || st.pods[e.uid] != e {
		return
	}
	n := st.nodes[e.node]
	n.usage.Remove(e.alloc, e.req)
	st.refreshLocked(n)
	delete(st.pods, e.uid)
	st.listener.Freed(st.now(), n.index)
}

// Release drops a reservation made by Reserve, unless the informer already
// replaced it or saw the pod bound with it. It reports whether it did.
func (st *State) Release(e *Entry) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.pods[e.uid] != e || !e.reserved {
		return false
	}
	// The pod is not seen bound: its host entry is the reservation's.
	st.replaceHostLocked(e.uid, hostEntry{}, false)
	st.removeLocked(e)
	return true
}

// refreshLocked records that n's inventory or usage changed: a new
// generation and summary. Callers hold the write lock.
func (st *State) refreshLocked(n *nodeState) {
	n.gen++
	n.summary = vgpu.Summarize(vgpu.NodeState{Inventory: n.inventory, Usage: &n.usage, HostFree: n.hostFreeLocked()}, st.workload)
	n.figures = n.summary.NodeFigures
	n.summaryWorkload = st.workload
}

// GPUModels returns the model of each GPU in node's inventory, by UUID.
func (st *State) GPUModels(node string) map[string]string {
	st.mu.RLock()
	defer st.mu.RUnlock()
	n := st.nodes[node]
	if n == nil {
		return nil
	}
	models := make(map[string]string, len(n.inventory.GPUs))
	for _, g := range n.inventory.GPUs {
		models[g.UUID] = g.Model
	}
	return models
}

// Usage returns a copy of node's usage, for tests and debugging.
func (st *State) Usage(node string) *vgpu.NodeUsage {
	st.mu.RLock()
	defer st.mu.RUnlock()
	n := st.nodes[node]
	if n == nil {
		return &vgpu.NodeUsage{}
	}
	return n.usage.Clone()
}

// Reservations returns how many pods are counted from a reservation.
func (st *State) Reservations() int {
	st.mu.RLock()
	defer st.mu.RUnlock()
	count := 0
	for _, e := range st.pods {
		if e.reserved {
			count++
		}
	}
	return count
}

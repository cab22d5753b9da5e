package deviceplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
)

// pendingContainer is a container the scheduler placed on this node that
// does not hold its devices yet.
type pendingContainer struct {
	Ref   containerRef
	Pod   *corev1.Pod
	Alloc vgpu.ContainerAllocation
	// order is the container's place in the allocation (init containers
	// first, in spec order), the kubelet's admission order within a pod.
	order int
}

// preferred answers GetPreferredAllocation. It never fails: with no match,
// or when the PodResources API does not answer within PreferWait (failed
// calls are retried with back-off), it returns the kubelet's default
// choice (the must-include IDs, then the first available ones). Each call
// is timed in MetricCallDuration.
func (a *allocator) preferred(ctx context.Context, req *pluginapi.PreferredAllocationRequest) *pluginapi.PreferredAllocationResponse {
	began := a.clock.Now()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, creq := range req.GetContainerRequests() {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: a.preferOne(ctx, creq)})
	}
	a.metrics.took(CallGetPreferredAllocation, a.clock.Since(began))
	return resp
}

// preferOne steers the kubelet to devices on the GPUs the scheduler chose.
// The request carries no pod identity, so it picks, among the pending
// containers of the pods the kubelet lists (offerPending), the first one
// that needs AllocationSize GPUs, has an available device on each of its
// GPUs and covers the must-include IDs; it answers one device per chosen
// GPU, the lowest free slice, and records the offer. The pod view may lag
// the kubelet's own pod watch, so without an answer it waits for pod
// changes up to PreferWait before it falls back. That wait starts at the
// first PodResources answer: a kubelet under load may take seconds to
// answer, and guessing meanwhile would make Allocate refuse the pod, so
// PodResources itself is waited for (and asked again while its rate limit
// refuses) up to OwnerWait.
func (a *allocator) preferOne(ctx context.Context, creq *pluginapi.ContainerPreferredAllocationRequest) []string {
	avail, must, size := creq.GetAvailableDeviceIDs(), creq.GetMustIncludeDeviceIDs(), int(creq.GetAllocationSize())
	fallback := defaultPick(avail, must, size)
	if a.pods == nil || size <= 0 {
		return fallback
	}
	syncCtx, cancelSync := context.WithTimeout(ctx, a.t.PreferWait)
	defer cancelSync()
	if !a.waitSynced(syncCtx) {
		a.logger.Info("GetPreferredAllocation: the pod view has not listed the node's pods yet; the kubelet chooses")
		return fallback
	}
	listCtx, cancel := context.WithTimeout(ctx, max(a.t.OwnerWait, a.t.PreferWait))
	defer cancel()
	var viewWait <-chan time.Time // runs from the first answer
	delay := a.t.RetryInitial
	for {
		changed := a.pods.Changed()
		pods, err := a.admitList(listCtx)
		if err != nil {
			// Its rate limit rejects at once: a guess now would put the
			// devices on GPUs Allocate then refuses, so ask again while
			// the wait lasts.
			if a.sleep(listCtx, delay) {
				delay = min(2*delay, a.t.RetryMax)
				continue
			}
			a.logger.V(2).Info("GetPreferredAllocation: PodResources did not answer; the kubelet chooses", "err", err.Error())
			return fallback
		}
		if pick, done := a.offerPending(listCtx, containerDevices(pods, a.cfg.ResourceName), listedPods(pods), avail, must, size); done {
			return pick
		}
		if viewWait == nil {
			timer := a.clock.NewTimer(a.t.PreferWait)
			defer timer.Stop()
			viewWait = timer.C()
		}
		select {
		case <-changed:
		case <-viewWait:
			a.logger.V(2).Info("GetPreferredAllocation: no pending container fits; the kubelet chooses", "size", size, "mustInclude", must)
			return fallback
		case <-listCtx.Done():
			a.logger.V(2).Info("GetPreferredAllocation: no pending container fits; the kubelet chooses", "size", size, "mustInclude", must)
			return fallback
		}
	}
}

// offerPending finds the container preferOne steers for and records the
// offer; done means preferOne answers now with pick (the fallback when
// nothing fits), false that it waits for the pod view to change. Only
// containers of pods the kubelet lists can be asking (admittedPending), and
// among them those not offered devices within ClaimTTL come first: a listed
// container that holds no devices although it was offered some is not the
// one being admitted (its container ran on before a kubelet restart that
// lost its devices, say), while the pod being admitted was never offered
// any.
func (a *allocator) offerPending(ctx context.Context, held map[containerRef][]string, listed map[types.NamespacedName]bool, avail, must []string, size int) (pick []string, done bool) {
	now := a.clock.Now()
	pending, source := a.admittedPending(ctx, held, listed)
	slices.SortStableFunc(pending, func(x, y pendingContainer) int {
		ox := a.claims.recentlyOffered(x.Ref, x.Pod.UID, now.Add(-a.t.ClaimTTL))
		oy := a.claims.recentlyOffered(y.Ref, y.Pod.UID, now.Add(-a.t.ClaimTTL))
		switch {
		case ox == oy:
			return 0
		case oy:
			return -1
		default:
			return 1
		}
	})
	offer := func(pending []pendingContainer) ([]string, bool) {
		for _, c := range pending {
			if len(c.Alloc.GPUs) != size {
				continue
			}
			pick, ok := pickDevices(c.Alloc.GPUs, avail, must)
			if !ok {
				continue
			}
			a.claims.offer(claim{Device: handoff.DeviceName(pick), DeviceIDs: pick, Ref: c.Ref, PodUID: c.Pod.UID, At: now, Sole: len(pending) == 1})
			a.logger.V(2).Info("Preferred devices on the scheduler's GPUs", "container", c.Ref, "devices", pick)
			return pick, true
		}
		return nil, false
	}
	if pick, ok := offer(pending); ok {
		return pick, true
	}
	if source == fromView {
		// The view may still show an earlier pod of that name, with another
		// allocation: the API server's pods decide.
		if live, err := a.livePending(ctx, held, listed); err == nil {
			if pick, ok := offer(live); ok {
				return pick, true
			}
		}
	}
	if source != fromNothing {
		// The pod being admitted cannot get devices on its GPUs (or has no
		// allocation): Allocate refuses whatever the kubelet picks, and the
		// kubelet rejects the pod with that reason.
		a.logger.V(2).Info("GetPreferredAllocation: no container the kubelet admits fits; the kubelet chooses", "size", size, "admitted", len(pending))
		return defaultPick(avail, must, size), true
	}
	return nil, false
}

// pendingSource says where admittedPending's answer came from.
type pendingSource int

const (
	// fromNothing: PodResources or the API server did not answer, so
	// waiting may change the answer.
	fromNothing pendingSource = iota
	// fromView: the view showed listed pending containers; it may still
	// show an earlier pod of one of those names, which the API server
	// would correct (livePending).
	fromView
	// fromAPIServer: the API server, read now, decided.
	fromAPIServer
)

// admittedPending returns the pending containers (pendingContainers) of
// the pods the kubelet lists. The kubelet adds a pod to the pods it lists
// before it admits it and drops it from the list once rejected, so the
// container that GetPreferredAllocation or Allocate is called for is among
// them; a pod the kubelet does not list yet cannot be the one asking,
// whatever its age (guessing one put the asking container's devices on
// another pod's GPUs, where its own allocation could never start: found by
// the chaos soak). When the view shows none, it lags the kubelet: by
// milliseconds while the cores are busy (the kubelet's watch and the
// view's get the same events), or for longer while its watch is being
// re-established after an API server restart. So the pods are read from
// the API server, and the view is watched meanwhile: whichever shows a
// listed pending container first answers (the other read is dropped).
// The kubelet admits one pod at a time and waits for this, so the read
// alone would delay every pod behind: in a burst of 40 GPU pods onto one
// node, the view lagged at 1–2 admissions of every burst, and the read
// took 50–125 ms each time, where the view caught up within milliseconds.
// A nil listed (PodResources did not answer) falls back to every pending
// container of the view, oldest first.
func (a *allocator) admittedPending(ctx context.Context, held map[containerRef][]string, listed map[types.NamespacedName]bool) ([]pendingContainer, pendingSource) {
	if listed == nil {
		return a.pendingContainers(a.pods.Pods(), held), fromNothing
	}
	inView := func() []pendingContainer { return listedPending(a.pendingContainers(a.pods.Pods(), held), listed) }
	changed := a.pods.Changed()
	if pending := inView(); len(pending) > 0 {
		return pending, fromView
	}
	if a.live == nil {
		return nil, fromNothing
	}
	type answer struct {
		pending []pendingContainer
		err     error
	}
	liveCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	live := make(chan answer, 1)
	go func() {
		pending, err := a.livePending(liveCtx, held, listed)
		live <- answer{pending, err}
	}()
	for {
		select {
		case got := <-live:
			if got.err != nil {
				a.logger.V(2).Info("The pod view shows no pod the kubelet admits, and the API server did not answer", "err", got.err.Error())
				return nil, fromNothing
			}
			return got.pending, fromAPIServer
		case <-changed:
			changed = a.pods.Changed()
			if pending := inView(); len(pending) > 0 {
				return pending, fromView
			}
		}
	}
}

// livePending returns the pending containers of the pods the kubelet
// lists, as the API server has the pods now.
func (a *allocator) livePending(ctx context.Context, held map[containerRef][]string, listed map[types.NamespacedName]bool) ([]pendingContainer, error) {
	if a.live == nil {
		return nil, errors.New("no API server to read the pods from")
	}
	pods, err := a.livePods(ctx)
	if err != nil {
		return nil, err
	}
	return listedPending(a.pendingContainers(pods, held), listed), nil
}

// livePods lists the pods bound to this node from the API server: a
// consistent list, for when the view may lag, made after the call began.
// Only the kubelet's admission asks for it (GetPreferredAllocation and
// Allocate, one pod at a time), so calls are not shared: sharing would
// make one wait for a list in flight to end, then for a list of its own.
func (a *allocator) livePods(ctx context.Context) ([]*corev1.Pod, error) {
	obj, err := a.live.ListWithContext(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the pods of node %s: %w", a.cfg.NodeName, err)
	}
	list, ok := obj.(*corev1.PodList)
	if !ok {
		return nil, fmt.Errorf("list the pods of node %s: got a %T", a.cfg.NodeName, obj)
	}
	pods := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		pods[i] = &list.Items[i]
	}
	return pods, nil
}

// listedPending keeps the containers of pending whose pods are in listed.
func listedPending(pending []pendingContainer, listed map[types.NamespacedName]bool) []pendingContainer {
	return slices.DeleteFunc(pending, func(c pendingContainer) bool { return !listed[c.Ref.pod()] })
}

// pendingContainers lists, of each of pods (the pods bound to this node)
// that the scheduler placed here, the first container in allocation order
// that holds no devices yet (held comes from PodResources) and, in mode
// env, was not allocated yet, oldest pod first (creation time, then
// namespace/name). Terminal and deleted pods, unreadable allocations,
// allocations for other nodes and regular init containers (the kubelet
// hands their devices to the app containers) are left out.
//
// The kubelet allocates a pod's containers one after another in that
// order, so only the first that holds nothing can be the one asking: a
// later container of the same pod whose GPUs happen to match devices the
// kubelet chose for the first (its own GPU has no device left: unhealthy,
// say) must not let those devices through, or the first container would
// never start with them (every start refused as a mismatch).
func (a *allocator) pendingContainers(pods []*corev1.Pod, held map[containerRef][]string) []pendingContainer {
	var out []pendingContainer
	for _, pod := range pods {
		if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		alloc, ok, err := a.pods.Allocation(pod)
		if !ok || err != nil || alloc.Node != a.cfg.NodeName {
			continue
		}
		for i, ca := range alloc.Containers {
			ref := containerRef{Namespace: pod.Namespace, Pod: pod.Name, Container: ca.Name}
			if ca.Init && !isSidecar(pod, ca.Name) {
				continue
			}
			if len(held[ref]) > 0 || a.claims.isBound(ref, pod.UID) {
				continue
			}
			out = append(out, pendingContainer{Ref: ref, Pod: pod, Alloc: ca, order: i})
			break // the pod's later containers wait for this one
		}
	}
	slices.SortFunc(out, func(x, y pendingContainer) int {
		return cmp.Or(
			x.Pod.CreationTimestamp.Compare(y.Pod.CreationTimestamp.Time),
			cmp.Compare(x.Ref.Namespace, y.Ref.Namespace),
			cmp.Compare(x.Ref.Pod, y.Ref.Pod),
			cmp.Compare(x.order, y.order),
		)
	})
	return out
}

// isSidecar reports whether pod has a restartable init container name.
func isSidecar(pod *corev1.Pod, name string) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return vgpu.IsSidecar(&c)
		}
	}
	return false
}

// pickDevices returns one ID of avail per wanted slice's GPU, in order: the
// must-include ID on that GPU if there is one, else the lowest slice
// number. It fails when a GPU has no available device, or a must-include
// ID is on a GPU outside want or shares its GPU with another one.
func pickDevices(want []vgpu.GPUSlice, avail, must []string) ([]string, bool) {
	lowest := map[string]int{} // GPU UUID -> lowest available slice number
	for _, id := range avail {
		uuid, n, ok := parseDeviceID(id)
		if !ok {
			continue
		}
		if cur, seen := lowest[uuid]; !seen || n < cur {
			lowest[uuid] = n
		}
	}
	mustOn := map[string]string{} // GPU UUID -> must-include ID
	for _, id := range must {
		uuid, ok := GPUOfDeviceID(id)
		if _, dup := mustOn[uuid]; !ok || dup {
			return nil, false
		}
		mustOn[uuid] = id
	}
	pick := make([]string, 0, len(want))
	for _, s := range want {
		if id, ok := mustOn[s.UUID]; ok {
			pick = append(pick, id)
			delete(mustOn, s.UUID)
			continue
		}
		n, ok := lowest[s.UUID]
		if !ok {
			return nil, false
		}
		pick = append(pick, DeviceID(s.UUID, n))
	}
	return pick, len(mustOn) == 0
}

// defaultPick is the kubelet's own choice: the must-include IDs, then the
// available ones in order, size in all, each ID once.
func defaultPick(avail, must []string, size int) []string {
	pick := make([]string, 0, len(must)+min(max(size, 0), len(avail)))
	for _, id := range must {
		if !slices.Contains(pick, id) {
			pick = append(pick, id)
		}
	}
	for _, id := range avail {
		if len(pick) >= size {
			break
		}
		if !slices.Contains(pick, id) {
			pick = append(pick, id)
		}
	}
	return pick
}

// allocationGPUs returns the sorted UUIDs of ca's slices.
func allocationGPUs(ca vgpu.ContainerAllocation) []string {
	uuids := make([]string, 0, len(ca.GPUs))
	for _, s := range ca.GPUs {
		uuids = append(uuids, s.UUID)
	}
	slices.Sort(uuids)
	return slices.Compact(uuids)
}

// listedPods returns the namespace and name of every pod in pods.
func listedPods(pods []*podresourcesapi.PodResources) map[types.NamespacedName]bool {
	out := make(map[types.NamespacedName]bool, len(pods))
	for _, p := range pods {
		out[types.NamespacedName{Namespace: p.GetNamespace(), Name: p.GetName()}] = true
	}
	return out
}

// admitList lists the kubelet's pods for GetPreferredAllocation. The
// kubelet admits a node's pods one at a time and waits for this call, so it
// does not join the container starts' shared calls: joining one waits for
// the call in flight to end and then for a call of its own.
func (a *allocator) admitList(ctx context.Context) ([]*podresourcesapi.PodResources, error) {
	if a.admitLister != nil {
		return a.admitLister.List(ctx)
	}
	return a.lister.List(ctx)
}

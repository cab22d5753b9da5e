package deviceplugin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/clock"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Hand-off timings.
const (
	// startBudget bounds PreStartContainer (the kubelet gives it 30 s) and
	// the wait of an env-mode Allocate for the pod view.
	startBudget = 25 * time.Second
	// ownerWait is how long a PodResources answer that names no owner is
	// asked again: the kubelet lists devices as soon as Allocate returns,
	// so an owner that stays missing is an error, not a delay.
	ownerWait = 5 * time.Second
	// listRetryInitial and listRetryMax bound the jittered back-off
	// between PodResources calls (its rate limit rejects at once).
	listRetryInitial = 50 * time.Millisecond
	listRetryMax     = 2 * time.Second
	// claimTTL is how long an offer keeps its container from being offered
	// again, and how long a binding or spec of devices nobody holds is
	// kept.
	claimTTL = time.Minute
	// gcInterval is how often stale specs and claims are collected.
	gcInterval = time.Minute
	// preferWait bounds how long GetPreferredAllocation waits for the pod
	// view (its first listing, then a fitting pending container) before it
	// lets the kubelet choose.
	// The kubelet admits one pod at a time, so every wait here delays every
	// pod behind it; the pod view lags the kubelet's own watch by
	// milliseconds, and when it lags more the API server is asked, so the
	// wait runs out only while the API server does not answer.
	preferWait = time.Second
	// specSettle is how long a CDI device name whose spec was rewritten
	// after it had defined another container's edits (a spec prepared for
	// another container: allocator.prepared) is kept from the container's
	// start: a runtime that resolves names from a cache it refreshes when
	// the folder changes (containerd 2.x) re-reads the folder within
	// milliseconds (1.6 ms for 16 files on an idle core, more than 100 ms
	// while a burst of writes kept it busy with 300), and the kubelet
	// retries a refused start after its pod worker's back-off (up to 10 s,
	// 1 s at the soonest seen).
	specSettle = time.Second
)

// timings are the hand-off's waits, fields so that tests can shorten them.
type timings struct {
	Budget, OwnerWait, RetryInitial, RetryMax, ClaimTTL, GCInterval, PreferWait, SpecSettle time.Duration
}

func defaultTimings() timings {
	return timings{
		Budget: startBudget, OwnerWait: ownerWait, RetryInitial: listRetryInitial, RetryMax: listRetryMax,
		ClaimTTL: claimTTL, GCInterval: gcInterval, PreferWait: preferWait, SpecSettle: specSettle,
	}
}

// errNoPodView means the plugin runs without an API client, so it cannot
// read any pod's allocation.
var errNoPodView = errors.New("no API server configured (--kubeconfig or in-cluster): the plugin cannot read the pods' GPU allocations")

// allocator is the bind → Allocate hand-off: it answers the kubelet's
// GetPreferredAllocation, Allocate and PreStartContainer so that every
// container gets exactly its own pod's slice (see docs/handoff.md). It is
// safe for concurrent use; nothing in it is node-wide locked.
type allocator struct {
	cfg  Config
	inv  *inventory
	pods podSource // nil: no API client, no allocations
	// live lists the node's pods from the API server itself (API.NodePods),
	// for the kubelet's admission when the view lags it (livePods); nil
	// trusts the view.
	live cache.ListerWithContext
	// livePod reads one pod from the API server (API.Pod), to confirm at
	// each container start that the view's pod of that name is the pod the
	// API server has now (currentPod); nil trusts the view.
	livePod func(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	lister  podLister // the kubelet's PodResources (coalesced)
	// admitLister is the kubelet's PodResources for GetPreferredAllocation,
	// not coalesced with the container starts' calls (nil: lister).
	admitLister podLister
	events      eventRecorder // nil: no events
	claims      *claimStore
	clock       clock.WithTicker
	t           timings
	logger      klog.Logger
	// metrics counts Allocate and PreStartContainer results; nil counts
	// nothing.
	metrics *pluginMetrics
	// enforcement is the node's mechanism (handoff.ChooseEnforcement); empty acts
	// as none.
	enforcement vgpu.Enforcement
	// nvidiaCDI is the NVIDIA toolkit's CDI device of each GPU, by UUID
	// (handoff.DetectDriverHook); used with the driver mechanism.
	nvidiaCDI map[string]string
	// driverUnverified says the driver mechanism is taken on the
	// operator's word (handoff.DriverHookAssume); the enforcement events
	// say so.
	driverUnverified bool
	// specLocks orders the writes of each CDI device's spec; preparing
	// counts the specs being prepared in the background (prepare).
	specLocks specLocks
	preparing sync.WaitGroup
}

// allocate answers Allocate. Mode cdi: one CDI device per container, named
// after its device IDs and a token of its own, and checkpointed (the spec
// is written under that name at PreStartContainer, or prepared now in the
// background for the container the kubelet is admitting: see
// claimStore.hold and prepare), and
// under the driver mechanism the NVIDIA toolkit's CDI devices of its GPUs,
// so that the runtime merges both specs and runs the toolkit's memory-limit
// hook. Mode
// env: the container's environment itself (see allocateEnv). Unknown IDs
// are an InvalidArgument error naming the ID; nothing is half-answered.
// Each call is counted in MetricAllocate and timed in MetricCallDuration.
func (a *allocator) allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	began := a.clock.Now()
	resp, err := a.allocateAll(ctx, req)
	a.metrics.allocated(err)
	a.metrics.took(CallAllocate, a.clock.Since(began))
	return resp, err
}

// allocateAll does allocate's work.
func (a *allocator) allocateAll(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, 0, len(req.GetContainerRequests()))}
	for _, creq := range req.GetContainerRequests() {
		ids, gpus, err := a.checkIDs(creq.GetDevicesIds())
		if err != nil {
			return nil, err
		}
		device := handoff.DeviceName(ids)
		var cresp *pluginapi.ContainerAllocateResponse
		if a.cfg.Mode == ModeEnv {
			if cresp, err = a.allocateEnv(ctx, ids, gpus, device); err != nil {
				return nil, err
			}
		} else if cresp, device, err = a.allocateCDI(ctx, ids, gpus, device); err != nil {
			return nil, err
		}
		a.logger.V(2).Info("Allocate", "devices", ids, "gpus", gpus, "mode", a.cfg.Mode, "cdiDevice", device)
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

// allocateCDI answers Allocate in mode cdi for ids (on gpus; key is their
// handoff.DeviceName): it checks them (requireAllocation), gives their
// holder a CDI device name of its own (claimStore.hold), prepares its spec
// when the offer named the container (prepare), and returns the answer and
// the name.
func (a *allocator) allocateCDI(ctx context.Context, ids, gpus []string, key string) (*pluginapi.ContainerAllocateResponse, string, error) {
	offered, err := a.requireAllocation(ctx, ids, gpus)
	if err != nil {
		return nil, "", err
	}
	var prepared *specOwner
	if offered != nil {
		prepared = &specOwner{Ref: offered.Ref, PodUID: offered.Pod.UID}
	}
	name := a.claims.hold(ids, a.clock.Now(), prepared)
	if offered != nil {
		a.prepare(key, name, *offered)
	}
	cresp := &pluginapi.ContainerAllocateResponse{CdiDevices: []*pluginapi.CDIDevice{{Name: handoff.CDIQualifiedName(name)}}}
	for _, nvidia := range a.nvidiaDevicesFor(gpus) {
		cresp.CdiDevices = append(cresp.CdiDevices, &pluginapi.CDIDevice{Name: nvidia})
	}
	return cresp, name, nil
}

// requireAllocation makes a mode-cdi Allocate refuse devices that the
// container being admitted cannot own. Allocate carries no pod identity,
// so it looks among the pending containers of the pods the kubelet lists
// (admittedPending) for one whose allocation has one slice per ID, on
// exactly the GPUs behind the IDs, waiting for the pod view up to
// OwnerWait; when the view shows listed containers but none fits, the API
// server's pods decide at once. A pod that bypassed the scheduler
// (spec.nodeName set at creation) has no allocation, and a pod whose
// devices the kubelet chose on other GPUs than its allocation's (its own
// GPU has no device left for it: unhealthy, say) can never start with
// them: refusing here makes the kubelet reject it at admission (phase
// Failed, with this message) and free its devices, instead of holding them
// while every start of the container is refused. The error is
// FailedPrecondition. Devices GetPreferredAllocation has just offered to
// the container being admitted pass without a list (freshOffer); when that
// container was the only one pending, it is returned, for Allocate to
// prepare its spec.
func (a *allocator) requireAllocation(ctx context.Context, ids, gpus []string) (*pendingContainer, error) {
	if a.pods == nil {
		return nil, status.Error(codes.FailedPrecondition, errNoPodView.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, a.t.OwnerWait)
	defer cancel()
	if !a.waitSynced(ctx) {
		return nil, status.Error(codes.Unavailable, "the plugin has not listed the node's pods yet (API server unreachable?)")
	}
	if c, sole, ok := a.freshOffer(ids, gpus); ok {
		if sole {
			return &c, nil
		}
		return nil, nil
	}
	held, listed := a.kubeletPods(ctx)
	fits := func(admitted []pendingContainer) bool {
		return slices.ContainsFunc(admitted, func(c pendingContainer) bool {
			return allocationFits(c.Alloc, ids, gpus)
		})
	}
	var admitted []pendingContainer
	for {
		changed := a.pods.Changed()
		var source pendingSource
		admitted, source = a.admittedPending(ctx, held, listed)
		if fits(admitted) {
			return nil, nil
		}
		if source == fromView {
			// The view may still show an earlier pod of that name.
			if live, err := a.livePending(ctx, held, listed); err == nil {
				source, admitted = fromAPIServer, live
				if fits(admitted) {
					return nil, nil
				}
			}
		}
		if source == fromAPIServer && len(admitted) > 0 {
			break // the API server decided: waiting cannot help
		}
		select {
		case <-changed:
			continue
		case <-ctx.Done():
		}
		break
	}
	if len(admitted) > 0 {
		c := admitted[0]
		return nil, status.Errorf(codes.FailedPrecondition,
			"the kubelet chose %s devices %v on GPUs %v, but container %s, which it admits, has its allocation of %d GPU slice(s) on %v%s: the container could never start with them; delete the pod so that it is created again",
			a.cfg.ResourceName, ids, gpus, c.Ref, len(c.Alloc.GPUs), allocationGPUs(c.Alloc), a.unhealthyNote(allocationGPUs(c.Alloc)))
	}
	return nil, status.Errorf(codes.FailedPrecondition,
		"no pod on node %s has a gpuslice allocation of %d GPU(s) on %v (devices %v): a pod that asks for %s must be bound by the gpuslice scheduler, "+
			"which writes the %s annotation; a pod created with spec.nodeName set bypasses it",
		a.cfg.NodeName, len(ids), gpus, ids, a.cfg.ResourceName, vgpu.AnnotationPodAllocation)
}

// offerTrust is how recent GetPreferredAllocation's offer of exactly the
// IDs Allocate is given must be for Allocate to take it as the answer.
const offerTrust = 2 * time.Second

// freshOffer reports whether GetPreferredAllocation offered exactly ids
// (on gpus) within offerTrust to a container whose pod the view still
// shows, with the offer's UID, not being deleted, and an allocation of
// that container on exactly gpus. The kubelet calls GetPreferredAllocation
// right before Allocate for the same container, and the offer was chosen
// from a PodResources list made then (preferOne), so Allocate need not
// list again: the kubelet admits one pod at a time, and the two lists
// were half of what each admission waited for in a burst of pods onto one
// node. Whatever Allocate accepts, PreStartContainer still hands the
// container its own pod's slice or refuses. It returns the offer's
// container, and whether it was the only pending one (claim.Sole).
func (a *allocator) freshOffer(ids, gpus []string) (c pendingContainer, sole, ok bool) {
	o, ok := a.claims.offered(handoff.DeviceName(ids))
	if !ok || a.clock.Since(o.At) > offerTrust {
		return pendingContainer{}, false, false
	}
	pod, ok := a.pods.Pod(o.Ref.Namespace, o.Ref.Pod)
	if !ok || pod.UID != o.PodUID || pod.DeletionTimestamp != nil {
		return pendingContainer{}, false, false
	}
	alloc, ok, err := a.pods.Allocation(pod)
	if !ok || err != nil {
		return pendingContainer{}, false, false
	}
	ca, ok := alloc.Container(o.Ref.Container)
	if !ok || !allocationFits(ca, ids, gpus) {
		return pendingContainer{}, false, false
	}
	return pendingContainer{Ref: o.Ref, Pod: pod, Alloc: ca}, o.Sole, true
}

// unhealthyNote names those of gpus that the node's inventory shows
// unhealthy, as a clause for an error message; "" when none is.
func (a *allocator) unhealthyNote(gpus []string) string {
	var parts []string
	for _, uuid := range gpus {
		if g, ok := a.inv.gpu(uuid); ok && g.Health != vgpu.Healthy {
			parts = append(parts, uuid+" is "+strings.ToLower(string(g.Health)))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ", and " + strings.Join(parts, ", ")
}

// kubeletPods returns the device IDs each container holds in PodResources
// (containerDevices) and the pods it lists (listedPods), or nil and nil
// when PodResources does not answer.
func (a *allocator) kubeletPods(ctx context.Context) (map[containerRef][]string, map[types.NamespacedName]bool) {
	pods, err := a.lister.List(ctx)
	if err != nil {
		a.logger.V(2).Info("Allocate: PodResources did not answer; matching without it", "err", err.Error())
		return nil, nil
	}
	return containerDevices(pods, a.cfg.ResourceName), listedPods(pods)
}

// waitPending calls match until it finds a container, again after every
// change of the pod view, until ctx ends (false).
func (a *allocator) waitPending(ctx context.Context, match func() (pendingContainer, bool)) (pendingContainer, bool) {
	for {
		changed := a.pods.Changed()
		if c, ok := match(); ok {
			return c, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return pendingContainer{}, false
		}
	}
}

// checkIDs validates device IDs made by DeviceID for advertised GPUs. It
// returns them sorted without repeats and the UUIDs of their GPUs, sorted;
// errors are InvalidArgument and name the ID.
func (a *allocator) checkIDs(ids []string) (sorted, gpus []string, err error) {
	if len(ids) == 0 {
		return nil, nil, status.Error(codes.InvalidArgument, "no device IDs")
	}
	for _, id := range ids {
		uuid, ok := GPUOfDeviceID(id)
		if !ok {
			return nil, nil, status.Errorf(codes.InvalidArgument, "device ID %q was not made by this plugin (want <GPU UUID>%s<slice>)", id, deviceIDSeparator)
		}
		if _, ok := a.inv.gpu(uuid); !ok {
			return nil, nil, status.Errorf(codes.InvalidArgument, "device ID %q names GPU %s, which this node does not advertise", id, uuid)
		}
		gpus = append(gpus, uuid)
	}
	sorted = slices.Clone(ids)
	slices.Sort(sorted)
	slices.Sort(gpus)
	return slices.Compact(sorted), slices.Compact(gpus), nil
}

// waitSynced waits until the pod view has listed the node's pods once, or
// ctx ends (false).
func (a *allocator) waitSynced(ctx context.Context) bool {
	for {
		changed := a.pods.Changed()
		if a.pods.HasSynced() {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// sleep waits d with ±50% jitter, or until ctx ends (false).
func (a *allocator) sleep(ctx context.Context, d time.Duration) bool {
	d = jitter(d)
	timer := a.clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C():
		return true
	}
}

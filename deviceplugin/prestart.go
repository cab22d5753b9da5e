package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/kubeletstate"
	"github.com/gpuslice/gpuslice/vgpu"
)

// preStart answers PreStartContainer, which the kubelet calls before every
// start of a container (restarts included) with its device IDs. It finds
// the container that holds exactly those IDs through the PodResources API,
// then, in mode cdi, writes the CDI spec of that container's slice; in
// mode env, checks that Allocate answered for that same container. A start
// that goes ahead gets a Normal event naming the enforcement mechanism that
// guards the container (ReasonEnforced). Any
// failure fails this start (the kubelet retries) with an error saying why,
// and a Warning event on the pod when the pod is known. It returns within
// the start budget, below the kubelet's 30 s timeout. Each call is counted
// in MetricPreStart, a refusal by its event reason, and timed in
// MetricCallDuration.
func (a *allocator) preStart(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	began := a.clock.Now()
	result, err := a.startContainer(ctx, req)
	a.metrics.preStarted(result)
	a.metrics.took(CallPreStartContainer, a.clock.Since(began))
	if err != nil {
		return nil, err
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}

// startContainer does preStart's work and returns the result label of the
// call beside its gRPC error.
func (a *allocator) startContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (string, error) {
	ids, gpus, err := a.checkIDs(req.GetDevicesIds())
	if err != nil {
		return resultOf(err), err
	}
	ctx, cancel := context.WithTimeout(ctx, a.t.Budget)
	defer cancel()
	if a.pods == nil {
		err := status.Error(codes.FailedPrecondition, errNoPodView.Error())
		return resultOf(err), err
	}
	ref, err := a.findOwner(ctx, ids)
	if err != nil {
		a.logger.Info("Refusing container start", "devices", ids, "err", err.Error())
		err := status.Error(codes.FailedPrecondition, err.Error())
		return resultOf(err), err
	}
	rec := a.kubeletRecord(ref, ids)
	if a.cfg.Mode == ModeEnv {
		if err = a.verifyBinding(ctx, ref, ids, rec); err == nil {
			a.reportEnforcementFromView(ref)
		}
	} else {
		err = a.writeSpec(ctx, ref, ids, gpus, rec)
	}
	if err != nil {
		// Labelled with the refusal's reason, else the code reported.
		reported := a.report(ref, err)
		if r := (*refusal)(nil); errors.As(err, &r) {
			return r.Reason, reported
		}
		return resultOf(reported), reported
	}
	return ResultSuccess, nil
}

// writeSpec makes the IDs' spec file (specFile) define the CDI device name
// Allocate gave ref, the holder of ids (on gpus, as checkIDs returns them;
// rec is the kubelet's record of them), with ref's slice (cdiDeviceFor).
// It is checked on every start, since the pod of that name may be another
// one than at the last start, and written when missing or different
// (handoff.UpdateSpecFile): a spec Allocate prepared for this container
// (prepare) is left alone, so the runtime's cache keeps what it read. A
// spec prepared for another container is rewritten for this one, and the
// start is refused until the runtime has had SpecSettle to read the
// rewrite (prepared, settled).
func (a *allocator) writeSpec(ctx context.Context, ref containerRef, ids, gpus []string, rec kubeletRecord) error {
	pod, ca, err := a.matchingAllocation(ctx, ref, ids, gpus, rec)
	if err != nil {
		return err
	}
	edits, err := a.editsFor(pod, ca)
	if err != nil {
		return refuse(ReasonAllocationMismatch, ref, pod, "%w", err)
	}
	key := handoff.DeviceName(ids)
	name := a.cdiDeviceFor(ref, pod, ids, rec)
	spec, err := handoff.BuildSpec(name, edits)
	if err != nil {
		return refuse(ReasonSpecWriteFailed, ref, pod, "build the CDI spec of %s: %w", handoff.CDIQualifiedName(name), err)
	}
	unlock := a.specLocks.lock(key)
	defer unlock()
	file := a.specFile(key, name)
	owner, from, err := a.prepared(key, name, file, ref, pod)
	if err != nil {
		return err
	}
	written, err := handoff.UpdateSpecFile(a.cfg.CDISpecDir, file, spec)
	if err != nil {
		return refuse(ReasonSpecWriteFailed, ref, pod, "write the CDI spec of %s: %w", handoff.CDIQualifiedName(name), err)
	}
	if written {
		a.metrics.specWritten(CallPreStartContainer)
	}
	if err := a.settled(key, name, ref, pod, owner, from, written); err != nil {
		return err
	}
	a.logger.V(2).Info("CDI spec ready", "container", ref, "podUID", pod.UID, "cdiDevice", handoff.CDIQualifiedName(name), "devices", ids, "written", written, "enforcement", a.enforcement, "guarded", edits.Guarded)
	a.reportEnforcement(ref, pod, ca)
	return nil
}

// prepared checks, with key's spec lock held, the spec Allocate prepared
// under name (the holding of key, in file) against ref of pod, the
// container starting, and returns the container the spec is prepared for
// now (nil when none was). One prepared for another container
// (GetPreferredAllocation's offer was not the container the kubelet
// admitted: the view lacked the admitted pod, or still showed a pod of
// that name deleted since) is taken over: ref is recorded in its place
// (checkpointed before the spec is written), and the prepared spec, if
// not written yet, never is. When it was written (file defines name), a
// runtime that caches specs may keep serving those edits under the name
// the kubelet gave this container at Allocate until it reads the spec
// again: the take-over then records the time of the rewrite
// (specOwner.Rewritten) for settled, and returns the other container as
// from.
func (a *allocator) prepared(key, name, file string, ref containerRef, pod *corev1.Pod) (owner, from *specOwner, err error) {
	h, ok := a.claims.holding(key)
	if !ok || h.Name != name || h.For == nil {
		return nil, nil, nil
	}
	if h.For.is(ref, pod.UID) {
		return h.For, nil, nil
	}
	o := specOwner{Ref: ref, PodUID: pod.UID}
	if handoff.SpecDefines(a.cfg.CDISpecDir, file, name) {
		from, o.Rewritten = h.For, a.clock.Now()
		a.logger.Info("CDI spec prepared at Allocate for another container: rewriting it for the container that starts", "cdiDevice", handoff.CDIQualifiedName(name), "preparedFor", h.For.Ref, "preparedPodUID", h.For.PodUID, "container", ref, "podUID", pod.UID)
	}
	if _, err := a.claims.prepareFor(key, name, o); err != nil {
		return nil, nil, refuse(ReasonSpecWriteFailed, ref, pod, "record that CDI device %s is this container's: %w", handoff.CDIQualifiedName(name), err)
	}
	return &o, from, nil
}

// settled refuses the start of ref while its CDI device name, whose spec
// defined another container's edits until prepared rewrote it (o, the
// spec's container, has Rewritten set), may still resolve to those edits
// in a runtime that caches specs (containerd 2.x refreshes its cache when
// the folder changes, and nothing orders that refresh before the
// kubelet's CreateContainer): at the start that rewrote it (from, the
// other container, is then set), and until SpecSettle after. written says
// this start wrote the spec; when a later start writes it again (the
// rewrite failed), its time is recorded anew. The kubelet retries a
// refused start after its pod worker's back-off.
func (a *allocator) settled(key, name string, ref containerRef, pod *corev1.Pod, o, from *specOwner, written bool) error {
	if o == nil || o.Rewritten.IsZero() {
		return nil
	}
	qualified := handoff.CDIQualifiedName(name)
	if from != nil {
		return refuse(ReasonAllocationMismatch, ref, pod,
			"CDI device %s was prepared at Allocate for container %s of pod UID %s, not for this container of pod UID %s (the plugin's view lacked the pod the kubelet admitted, or showed a pod of that name deleted since): its spec now holds this container's slice, and the start is retried once a container runtime that caches specs has had %v to read it",
			qualified, from.Ref, from.PodUID, pod.UID, a.t.SpecSettle)
	}
	if written {
		again := *o
		again.Rewritten = a.clock.Now()
		if _, err := a.claims.prepareFor(key, name, again); err != nil {
			return refuse(ReasonSpecWriteFailed, ref, pod, "record that CDI device %s was rewritten for this container: %w", qualified, err)
		}
		o = &again
	}
	if since := a.clock.Since(o.Rewritten); since < a.t.SpecSettle {
		return refuse(ReasonAllocationMismatch, ref, pod,
			"CDI device %s was rewritten for this container %v ago, after a spec prepared at Allocate for another container: the start is retried once a container runtime that caches specs has had %v to read it",
			qualified, since.Round(time.Millisecond), a.t.SpecSettle)
	}
	return nil
}

// cdiDeviceFor returns the CDI device name Allocate gave ref, the holder
// of ids in pod (confirmed by matchingAllocation), for its start to write
// the spec under. The kubelet's record (rec) is the answer when it gives
// ids to ref's container of exactly pod and its Allocate answer names one
// of this plugin's devices for the IDs: that is the name the runtime is
// asked for at every start of the container. The plugin's own record may
// lack it, or still hold the IDs' previous holder's name: Allocate's
// checkpoint is written in the background (claimStore.hold), so a plugin
// killed between Allocate's answer and the write loses the name. A name
// taken from the kubelet's record that the plugin's record lacks is
// recorded in place of the other (the checkpoint written before it
// returns; a failed write is logged, and the next start takes it again).
// Otherwise it is cdiDeviceOf's.
func (a *allocator) cdiDeviceFor(ref containerRef, pod *corev1.Pod, ids []string, rec kubeletRecord) string {
	key := handoff.DeviceName(ids)
	recorded, has := a.claims.held(key)
	name, ok := rec.cdiDevice(key)
	switch {
	case !ok || !rec.confirms(ref, pod.UID):
		return a.cdiDeviceOf(ids)
	case has && name == recorded, name == key:
		return name
	}
	a.logger.Info("CDI device name taken from the kubelet's record: the plugin's record lacked it (the plugin stopped before Allocate's checkpoint was written?)",
		"container", ref, "podUID", pod.UID, "cdiDevice", handoff.CDIQualifiedName(name), "recorded", recorded)
	if err := a.claims.adopt(ids, name, a.clock.Now()); err != nil {
		a.logger.Error(err, "Recording the CDI device name taken from the kubelet's record", "cdiDevice", name, "container", ref)
	}
	return name
}

// cdiDeviceOf returns the CDI device name Allocate gave the holder of ids,
// as the plugin's record has it. Without one recorded, it is the IDs' key
// (handoff.DeviceName): the name a release before holder names gave,
// which a container allocated by one still has. A holder whose name is in
// neither the plugin's record nor the kubelet's (cdiDeviceFor) gets a spec
// its runtime never asks for, so its start fails as an unresolvable CDI
// device: it never starts with another holder's edits.
func (a *allocator) cdiDeviceOf(ids []string) string {
	key := handoff.DeviceName(ids)
	if name, ok := a.claims.held(key); ok {
		return name
	}
	return key
}

// matchingAllocation returns ref's pod and container allocation once the
// allocation fits the devices the container holds: one slice per ID, on
// exactly the GPUs behind the IDs. PodResources names the pod by namespace
// and name only, so a pod deleted and created again under the same name
// (a StatefulSet's web-0) can still be the old one in the pod view, with
// the old pod's allocation; the devices then give it away. A mismatch is
// waited out for OwnerWait (the view catching up), then the API server's
// pod of that name decides (apiServerMatch); without one that fits, the
// start is refused, as is one for a pod the view shows being deleted (the
// kubelet starts no container of one): the kubelet retries the start,
// which succeeds once the view shows the pod the devices were allocated
// for. A match is confirmed with the API
// server (currentAllocation), since the old and new pods' slices may be on
// the same GPU.
func (a *allocator) matchingAllocation(ctx context.Context, ref containerRef, ids, gpus []string, rec kubeletRecord) (*corev1.Pod, vgpu.ContainerAllocation, error) {
	waitCtx, cancel := context.WithTimeout(ctx, a.t.OwnerWait)
	defer cancel()
	for {
		changed := a.pods.Changed()
		pod, ca, err := a.podAllocation(ctx, ref)
		if err != nil {
			return nil, vgpu.ContainerAllocation{}, err
		}
		deleting := pod.DeletionTimestamp != nil
		if !deleting && allocationFits(ca, ids, gpus) {
			return a.currentAllocation(ctx, ref, ids, gpus, pod, ca, rec)
		}
		select {
		case <-changed:
			continue
		case <-waitCtx.Done():
		}
		if cur, cca, ok := a.apiServerMatch(ctx, ref, ids, gpus, pod); ok {
			return cur, cca, nil
		}
		if deleting {
			// The kubelet starts no container of a pod being deleted: the
			// one starting belongs to a pod of that name created again.
			return nil, vgpu.ContainerAllocation{}, refuse(ReasonAllocationMismatch, ref, pod,
				"pod %s/%s (UID %s) is being deleted in the plugin's view, so the container starting belongs to a pod of that name created again; the start is retried once the view shows it",
				pod.Namespace, pod.Name, pod.UID)
		}
		return nil, vgpu.ContainerAllocation{}, refuse(ReasonAllocationMismatch, ref, pod,
			"container %s holds %d %s devices on GPUs %v, but the allocation of pod %s/%s (UID %s) has %d GPU slices on %v: "+
				"the devices were allocated for another pod of that name (the plugin's view of a pod deleted and created again may lag); the start is retried",
			ref, len(ids), a.cfg.ResourceName, gpus, pod.Namespace, pod.Name, pod.UID, len(ca.GPUs), allocationGPUs(ca))
	}
}

// apiServerMatch is matchingAllocation's last resort once the view has
// shown viewPod, whose allocation does not fit ids (on gpus) or which is
// being deleted, for OwnerWait: the view's watch may stay broken for
// longer (it backs off while the API server restarts), and the pod of
// that name the API server has now is the one the kubelet starts. It
// returns that pod and ref's container allocation when it is another pod
// than viewPod, is not being deleted, and its allocation fits ids on
// gpus; false otherwise (no API client, the read failed, or no such pod).
func (a *allocator) apiServerMatch(ctx context.Context, ref containerRef, ids, gpus []string, viewPod *corev1.Pod) (*corev1.Pod, vgpu.ContainerAllocation, bool) {
	current, ca, err := a.livePodAllocation(ctx, ref)
	if err != nil || current.UID == viewPod.UID || current.DeletionTimestamp != nil || !allocationFits(ca, ids, gpus) {
		return nil, vgpu.ContainerAllocation{}, false
	}
	a.logger.Info("Pod view lags for longer than the owner wait: using the pod the API server has", "container", ref, "viewUID", viewPod.UID, "podUID", current.UID)
	return current, ca, true
}

// errNoLiveAllocation means the API server's pod carries no allocation.
var errNoLiveAllocation = errors.New("no " + vgpu.AnnotationPodAllocation + " annotation")

// livePodAllocation reads ref's pod from the API server (currentPod) and
// returns it with ref's container allocation: the read's error (also
// without an API client), one wrapping errNoLiveAllocation, or
// containerAllocation's refusal.
func (a *allocator) livePodAllocation(ctx context.Context, ref containerRef) (*corev1.Pod, vgpu.ContainerAllocation, error) {
	if a.livePod == nil {
		return nil, vgpu.ContainerAllocation{}, errors.New("no API server to read the pod from")
	}
	current, err := a.currentPod(ctx, ref)
	if err != nil {
		return nil, vgpu.ContainerAllocation{}, err
	}
	alloc, ok, err := a.pods.Allocation(current)
	if !ok {
		return nil, vgpu.ContainerAllocation{}, fmt.Errorf("pod %s/%s (UID %s): %w", ref.Namespace, ref.Pod, current.UID, errNoLiveAllocation)
	}
	return a.containerAllocation(ref, current, alloc, err)
}

// allocationFits reports whether ca has one slice per device of ids, on
// exactly gpus (the sorted GPUs behind ids).
func allocationFits(ca vgpu.ContainerAllocation, ids, gpus []string) bool {
	return len(ca.GPUs) == len(ids) && slices.Equal(allocationGPUs(ca), gpus)
}

// currentAllocation confirms that pod, the view's pod of ref whose
// allocation ca fits the devices, is the pod whose container the kubelet
// starts, and returns it with ca. The view may lag (its watch is being
// re-established after an API server restart) while a pod is deleted and
// created again under the same name with a slice on the same GPU: the GPUs
// then match, and only the UID tells the old pod from the new one. The
// kubelet's own record of the devices (rec) confirms it
// without a read; otherwise the API server does: when it has another pod
// of that name, that pod's own allocation is checked against the devices
// and returned instead. A read that fails, or finds no such pod, refuses
// the start (the kubelet retries): a container must not start with an
// allocation nobody confirmed is its own.
func (a *allocator) currentAllocation(ctx context.Context, ref containerRef, ids, gpus []string, pod *corev1.Pod, ca vgpu.ContainerAllocation, rec kubeletRecord) (*corev1.Pod, vgpu.ContainerAllocation, error) {
	if a.livePod == nil || rec.confirms(ref, pod.UID) {
		return pod, ca, nil
	}
	current, err := a.currentPod(ctx, ref)
	if err != nil {
		return nil, vgpu.ContainerAllocation{}, refuse(ReasonAllocationMismatch, ref, pod,
			"cannot confirm with the API server that pod %s/%s is still the one with UID %s: %w; the start is retried", ref.Namespace, ref.Pod, pod.UID, err)
	}
	if current.UID == pod.UID {
		return pod, ca, nil
	}
	alloc, ok, err := a.pods.Allocation(current)
	if !ok {
		return nil, vgpu.ContainerAllocation{}, refuse(ReasonAllocationMissing, ref, current,
			"pod %s/%s (UID %s) has no %s annotation: it was not scheduled by the gpuslice scheduler extender", ref.Namespace, ref.Pod, current.UID, vgpu.AnnotationPodAllocation)
	}
	current, cca, err := a.containerAllocation(ref, current, alloc, err)
	if err != nil {
		return nil, vgpu.ContainerAllocation{}, err
	}
	if current.DeletionTimestamp != nil || !allocationFits(cca, ids, gpus) {
		return nil, vgpu.ContainerAllocation{}, refuse(ReasonAllocationMismatch, ref, current,
			"container %s holds %d %s devices on GPUs %v, which neither pod %s/%s of the plugin's view (UID %s) nor the one the API server has now (UID %s, %d GPU slices on %v) can start with; the start is retried",
			ref, len(ids), a.cfg.ResourceName, gpus, ref.Namespace, ref.Pod, pod.UID, current.UID, len(cca.GPUs), allocationGPUs(cca))
	}
	a.logger.V(2).Info("Pod view lags: using the pod the API server has", "container", ref, "viewUID", pod.UID, "podUID", current.UID)
	return current, cca, nil
}

// kubeletRecord is what the kubelet's device checkpoint says of the
// holder of a set of device IDs (kubeletstate.DeviceHolder); ok is false
// when it says nothing (unreadable, no single holder).
type kubeletRecord struct {
	holder kubeletstate.Holder
	ok     bool
}

// kubeletRecord reads the kubelet's device checkpoint for ids, once per
// container start (ref is the container PodResources names, for the log).
// The kubelet writes it when it allocates the devices, before the
// container's first start, and hands devices that pass from pod to pod to
// the new pod only once the old one's entry is gone.
func (a *allocator) kubeletRecord(ref containerRef, ids []string) kubeletRecord {
	h, err := kubeletstate.DeviceHolder(a.cfg.DevicePluginDir, a.cfg.ResourceName, ids)
	if err != nil {
		a.logger.V(4).Info("The kubelet's device checkpoint does not name the container's pod", "container", ref, "err", err.Error())
		return kubeletRecord{}
	}
	return kubeletRecord{holder: h, ok: true}
}

// confirms reports whether r gives the IDs to ref's container in the pod
// of UID uid: that pod is then the one whose container starts, and the API
// server need not be asked (a consistent read, 33–43 ms at the median in a
// burst of 40 starts on one node, and a read of etcd for each). Another
// UID (a pod created again whose view lags; a static pod, whose UID the
// kubelet has under another value) or no record confirms nothing.
func (r kubeletRecord) confirms(ref containerRef, uid types.UID) bool {
	return r.ok && r.holder.PodUID == string(uid) && r.holder.Container == ref.Container
}

// cdiDevice returns the CDI device name of this plugin's kind in the
// Allocate answer r keeps, when it is one the plugin gives the IDs whose
// key is key: a holder's name of the key (handoff.IsHolderName), or the
// key itself (a release before holder names).
func (r kubeletRecord) cdiDevice(key string) (string, bool) {
	for _, q := range r.holder.CDIDevices {
		name, ok := strings.CutPrefix(q, handoff.CDIKind+"=")
		if ok && (name == key || handoff.IsHolderName(name, key)) {
			return name, true
		}
	}
	return "", false
}

// errPodGone means the API server has no pod of that name on this node.
var errPodGone = errors.New("no such pod on this node")

// currentPod reads ref's pod from the API server: one GET, a consistent
// read, made after the call began. It is on every container start's path:
// in a burst of 40 starts on one node, the shared list of the node's pods
// it made before took 88 ms at the median, one GET 24–28 ms. An error
// wraps errPodGone when the API server answered without such a pod.
func (a *allocator) currentPod(ctx context.Context, ref containerRef) (*corev1.Pod, error) {
	pod, err := a.livePod(ctx, ref.Namespace, ref.Pod)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("read pod %s/%s: %w", ref.Namespace, ref.Pod, err)
	case pod.Spec.NodeName == a.cfg.NodeName:
		return pod, nil
	}
	return nil, fmt.Errorf("the API server has no pod %s/%s on node %s: %w", ref.Namespace, ref.Pod, a.cfg.NodeName, errPodGone)
}

// verifyBinding checks, in mode env, that Allocate answered ids with the
// environment of ref, the container now starting with them, and of the
// very pod it belongs to (confirmBinding); rec is the kubelet's record of
// ids.
func (a *allocator) verifyBinding(ctx context.Context, ref containerRef, ids []string, rec kubeletRecord) error {
	pod, _ := a.pods.Pod(ref.Namespace, ref.Pod)
	b, ok := a.claims.binding(handoff.DeviceName(ids))
	if !ok {
		return refuse(ReasonAllocationMismatch, ref, pod,
			"devices %v were not allocated by this plugin but started for %s (checkpoint lost?): delete the pod so that it is created again", ids, ref)
	}
	if b.Ref != ref {
		return refuse(ReasonAllocationMismatch, ref, pod,
			"devices %v were allocated to %s but started for %s: the container would run with another pod's limits; delete the pod so that it is created again", ids, b.Ref, ref)
	}
	return a.confirmBinding(ctx, ref, ids, b, pod, rec)
}

// confirmBinding checks that b, the binding of ids to ref, is for the pod
// whose container starts, by UID, as mode cdi confirms its pods
// (currentAllocation): the kubelet's record (rec) confirms it without a
// read; otherwise the API server's pod of that name decides (one GET). The
// view (pod, nil when it lacks ref's pod) cannot: while it lags, a pod
// deleted and created again under the same name (a StatefulSet's web-0)
// shows the old pod's UID, which a binding made from that view has too,
// and the new container would run with the old pod's limits. A start the
// API server cannot confirm is refused (the kubelet retries); one of
// another pod is refused for good, since the kubelet replays Allocate's
// environment at every start. Without an API client the view decides.
func (a *allocator) confirmBinding(ctx context.Context, ref containerRef, ids []string, b claim, pod *corev1.Pod, rec kubeletRecord) error {
	if rec.confirms(ref, b.PodUID) {
		return nil
	}
	uid := types.UID("")
	if a.livePod == nil {
		if pod == nil {
			return nil
		}
		uid = pod.UID
	} else {
		current, err := a.currentPod(ctx, ref)
		if err != nil {
			return refuse(ReasonAllocationMismatch, ref, pod,
				"cannot confirm with the API server that devices %v of %s were allocated for its pod (UID %s): %w; the start is retried", ids, ref, b.PodUID, err)
		}
		pod, uid = current, current.UID
	}
	if uid != b.PodUID {
		return refuse(ReasonAllocationMismatch, ref, pod,
			"devices %v were allocated to %s (pod UID %s) but started for %s (pod UID %s): the container would run with another pod's limits; delete the pod so that it is created again", ids, b.Ref, b.PodUID, ref, uid)
	}
	return nil
}

// report turns a start refusal into the gRPC error and, when the pod is
// known, a Warning event on it.
func (a *allocator) report(ref containerRef, err error) error {
	a.logger.Info("Refusing container start", "container", ref, "err", err.Error())
	var r *refusal
	if !errors.As(err, &r) {
		return status.Error(codes.Internal, err.Error())
	}
	if a.events != nil {
		var obj runtime.Object = r.Pod
		if r.Pod == nil {
			obj = &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ref.Namespace, Name: ref.Pod}
		}
		a.events.Eventf(obj, corev1.EventTypeWarning, r.Reason, "container %s: %s", ref.Container, r.Err.Error())
	}
	return status.Error(codes.FailedPrecondition, fmt.Sprintf("%s: %s", r.Reason, r.Err.Error()))
}

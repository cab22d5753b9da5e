package nvidia

import (
	"context"
	"fmt"
	"reflect"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuslice/gpuslice/vgpu"
)

// WatchHealth blocks until ctx ends, sending one vgpu.HealthEvent on events
// each time a GPU's health changes, and returns nil then. It returns
// ErrClosed when Close ends it, and an error when NVML cannot watch at all.
// It never closes events.
//
// An application-fault XID (ClassifyXID) is logged; the GPU stays healthy.
// A device-fault or reset-required XID marks its GPU Unhealthy. CoolDown
// later the GPU is probed (its handle is looked up by UUID and its memory
// read); when NVML answers a device-fault GPU turns Healthy again,
// otherwise it is probed again after another CoolDown. A reset-required GPU
// must also show that it was reset: NVML's GPU recovery action
// (nvml.FI_DEV_GET_GPU_RECOVERY_ACTION, read at the fault and at each
// probe) must have been seen pending and then read "none". Such a fault is
// recorded in Options.FaultRecordDir until then, so that it outlives the
// Backend (Open). Where NVML cannot report the action, the GPU stays
// unhealthy until the node reboots, or, without records, until the plugin
// starts again.
// A further fault while unhealthy restarts the CoolDown. GPUs that cannot
// report events, or whose registration for them fails while they answer
// NVML, are logged and left healthy.
//
// Health outlives the call: GPUs reports it, and a later WatchHealth goes on
// probing GPUs left unhealthy. At most one WatchHealth runs at a time
// (ErrAlreadyWatching). It logs to ctx's logger when ctx has one.
func (b *Backend) WatchHealth(ctx context.Context, events chan<- vgpu.HealthEvent) error {
	if err := b.startWatch(); err != nil {
		return err
	}
	defer b.endWatch()

	logger, err := logr.FromContext(ctx)
	if err != nil {
		logger = b.logger
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(b.closing, cancel)()

	set, ret := b.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML create event set: %w", ret)
	}
	w := &watcher{
		b:       b,
		ctx:     ctx,
		logger:  logger,
		events:  events,
		set:     set,
		devices: map[string]*watchedDevice{},
		probes:  make(chan probeDue),
	}
	err = w.run()
	cancel() // run may return early on an error: stop the helpers too
	w.goroutines.Wait()
	if ret := set.Free(); ret != nvml.SUCCESS {
		logger.Error(ret, "NVML free event set")
	}
	switch {
	case err != nil:
		return err
	case parent.Err() == nil && b.closing.Err() != nil:
		return ErrClosed
	}
	return nil
}

// watcher is the state of one WatchHealth call. Its fields belong to the
// goroutine running run; the helper goroutines only send on channels.
type watcher struct {
	b      *Backend
	ctx    context.Context
	logger klog.Logger
	events chan<- vgpu.HealthEvent
	set    nvml.EventSet

	devices map[string]*watchedDevice // by UUID
	order   []string                  // UUIDs in NVML index order
	probes  chan probeDue
	// goroutines are the event-wait loop and the probe timers.
	goroutines sync.WaitGroup
}

// watchedDevice is one GPU the watcher knows by UUID.
type watchedDevice struct {
	uuid  string
	index int
	// handle is the NVML handle, nil when the GPU did not answer at start.
	handle nvml.Device
	// registered says XID events are registered, or that the GPU cannot
	// report them (nothing left to try).
	registered bool
	// probe is the pending re-probe, nil while healthy.
	probe *probeTimer
}

// probeTimer is one scheduled re-probe; gen tells a stale one apart.
type probeTimer struct {
	gen   uint64
	timer clock.Timer
	stop  chan struct{}
}

// probeDue asks run to probe a GPU.
type probeDue struct {
	uuid string
	gen  uint64
}

// waitResult is one answer of EventSet.Wait other than a timeout.
type waitResult struct {
	data nvml.EventData
	ret  nvml.Return
}

func (w *watcher) run() error {
	if err := w.discover(); err != nil {
		return err
	}
	// Probe the GPUs an earlier WatchHealth left unhealthy.
	w.b.mu.Lock()
	var pending []*watchedDevice
	for _, uuid := range w.order {
		if _, faulty := w.b.faults[uuid]; faulty && w.devices[uuid].probe == nil {
			pending = append(pending, w.devices[uuid])
		}
	}
	w.b.mu.Unlock()
	for _, d := range pending {
		w.schedule(d)
	}

	waits := make(chan waitResult)
	w.goroutines.Add(1)
	go w.waitLoop(waits)

	for {
		select {
		case <-w.ctx.Done():
			return nil
		case r := <-waits:
			if r.ret == nvml.SUCCESS {
				w.onEvent(r.data)
				continue
			}
			w.logger.Error(r.ret, "NVML event wait failed; retrying after the cool-down", "coolDown", w.b.coolDown)
			if r.ret == nvml.ERROR_GPU_IS_LOST {
				// NVML does not say which GPU; probes sort the healthy ones out.
				w.markAll("NVML reports a lost GPU: " + r.ret.Error())
			}
		case p := <-w.probes:
			d := w.devices[p.uuid]
			if d == nil || d.probe == nil || d.probe.gen != p.gen {
				continue // superseded by a later fault
			}
			w.probeDevice(d)
		}
	}
}

// discover finds every GPU and registers it for XID events. GPUs that do
// not answer are marked unhealthy when an earlier GPUs call knew them.
func (w *watcher) discover() error {
	n, ret := w.b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML device count: %w", ret)
	}
	for i := range n {
		dev, ret := w.b.lib.DeviceGetHandleByIndex(i)
		uuid := ""
		if ret == nvml.SUCCESS {
			uuid, ret = dev.GetUUID()
		}
		if ret != nvml.SUCCESS {
			w.b.mu.Lock()
			last, seen := w.b.known[i]
			w.b.mu.Unlock()
			if !seen {
				w.logger.Error(ret, "GPU does not answer and was never listed; not watching it", "index", i)
				continue
			}
			d := &watchedDevice{uuid: last.UUID, index: i}
			w.add(d)
			w.markUnhealthy(d, fmt.Sprintf("GPU %d does not answer NVML: %v", i, ret))
			continue
		}
		d := &watchedDevice{uuid: uuid, index: i, handle: dev}
		w.add(d)
		if err := w.register(d); err != nil {
			// A GPU that answers stays in service, unwatched; one that
			// does not is unhealthy, and its probe retries registration.
			if _, ret := dev.GetMemoryInfo(); ret != nvml.SUCCESS {
				w.markUnhealthy(d, fmt.Sprintf("GPU %d does not answer NVML: %v", i, ret))
				continue
			}
			w.logger.Error(err, "Cannot watch GPU for XID events; it stays healthy", "gpu", uuid, "index", i)
		}
	}
	return nil
}

func (w *watcher) add(d *watchedDevice) {
	w.devices[d.uuid] = d
	w.order = append(w.order, d.uuid)
}

// register asks NVML for d's XID events. A GPU that cannot report them
// (ERROR_NOT_SUPPORTED) is logged and counts as registered; any other
// failure is returned and leaves d unregistered.
func (w *watcher) register(d *watchedDevice) error {
	supported, ret := d.handle.GetSupportedEventTypes()
	if ret == nvml.SUCCESS && supported&nvml.EventTypeXidCriticalError == 0 {
		ret = nvml.ERROR_NOT_SUPPORTED
	}
	if ret == nvml.SUCCESS {
		ret = d.handle.RegisterEvents(nvml.EventTypeXidCriticalError, w.set)
	}
	switch ret {
	case nvml.SUCCESS:
		d.registered = true
		return nil
	case nvml.ERROR_NOT_SUPPORTED:
		w.logger.Info("GPU cannot report XID events; its health is not watched", "gpu", d.uuid, "index", d.index)
		d.registered = true
		return nil
	default:
		return fmt.Errorf("GPU %d: NVML register XID events: %w", d.index, ret)
	}
}

// waitLoop waits for NVML events until ctx ends and hands each answer other
// than a timeout to run. After a failed wait it pauses for CoolDown.
func (w *watcher) waitLoop(out chan<- waitResult) {
	defer w.goroutines.Done()
	timeoutMs := uint32(w.b.eventWait.Milliseconds()) //nolint:gosec // G115: Validate bounds it to 1m
	for w.ctx.Err() == nil {
		data, ret := w.set.Wait(timeoutMs)
		if ret == nvml.ERROR_TIMEOUT {
			continue
		}
		select {
		case out <- waitResult{data: data, ret: ret}:
		case <-w.ctx.Done():
			return
		}
		if ret != nvml.SUCCESS {
			select {
			case <-w.b.clock.After(w.b.coolDown):
			case <-w.ctx.Done():
				return
			}
		}
	}
}

// onEvent handles one NVML event: device-fault XIDs mark their GPU
// unhealthy, or every GPU when NVML does not say which.
func (w *watcher) onEvent(e nvml.EventData) {
	if e.EventType != nvml.EventTypeXidCriticalError {
		return
	}
	xid := e.EventData
	class := ClassifyXID(xid)
	d := w.identify(e.Device)
	uuid := ""
	if d != nil {
		uuid = d.uuid
		w.b.countXID(uuid, xid)
	}
	if class.Kind == ApplicationFault {
		w.logger.Info("XID is an application fault; GPU stays healthy", "gpu", uuid, "xid", xid, "description", class.Description)
		return
	}
	reason := fmt.Sprintf("XID %d: %s", xid, class.Description)
	if d == nil {
		// Taking every GPU out until a reset would turn one fault into a
		// node outage: the probes sort them out.
		w.logger.Info("Device-fault XID on an unidentified GPU; marking every GPU unhealthy until probed", "xid", xid, "description", class.Description, "action", class.Action)
		w.markAll(reason + " (GPU not identified)")
		return
	}
	if class.Kind == ResetRequired {
		w.logger.Info("XID needs a GPU reset or a reboot; GPU unhealthy until NVML shows it was reset", "gpu", uuid, "xid", xid, "description", class.Description, "action", class.Action)
		w.markFault(d, reason+" (needs "+resetWord(class)+")", xid)
		return
	}
	w.logger.Info("Device-fault XID; GPU unhealthy until it answers a probe", "gpu", uuid, "xid", xid, "description", class.Description, "coolDown", w.b.coolDown)
	w.markUnhealthy(d, reason)
}

// resetWord names the recovery an XID of class needs.
func resetWord(class XIDClass) string {
	if class.Reboot {
		return "a reboot"
	}
	return "a GPU reset"
}

// identify finds the watched GPU an event came from: by the UUID NVML gives
// for the handle, else by the handle itself.
func (w *watcher) identify(dev nvml.Device) *watchedDevice {
	if dev == nil {
		return nil
	}
	if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
		if d := w.devices[uuid]; d != nil {
			return d
		}
	}
	if !reflect.TypeOf(dev).Comparable() {
		return nil
	}
	for _, uuid := range w.order {
		if d := w.devices[uuid]; d.handle != nil && reflect.TypeOf(d.handle).Comparable() && d.handle == dev {
			return d
		}
	}
	return nil
}

func (w *watcher) markAll(reason string) {
	for _, uuid := range w.order {
		w.markUnhealthy(w.devices[uuid], reason)
	}
}

// markUnhealthy records a recoverable fault on d (markFault).
func (w *watcher) markUnhealthy(d *watchedDevice, reason string) {
	w.markFault(d, reason, 0)
}

// markFault records a fault on d, sends an event if d was healthy, and
// (re)starts its CoolDown. resetXID, when not 0, is the XID of a fault
// that needs a reset: such a fault stays so until the probe sees the
// reset, whatever comes after it; its GPU's recovery action is read at
// once, as the driver sets it with the XID, and the fault is recorded
// (syncRecord).
func (w *watcher) markFault(d *watchedDevice, reason string, resetXID uint64) {
	w.b.mu.Lock()
	old, wasFaulty := w.b.faults[d.uuid]
	f := fault{reason: reason, resetRequired: resetXID != 0 || old.resetRequired, downSeen: old.downSeen && old.resetRequired}
	switch {
	case old.resetRequired:
		f.xid, f.since = old.xid, old.since
	case resetXID != 0:
		f.xid, f.since = resetXID, w.b.clock.Now()
	}
	w.b.faults[d.uuid] = f
	w.b.mu.Unlock()
	if f.resetRequired && d.handle != nil {
		// A driver without the field is told apart at the probe.
		_, _ = w.readRecoveryAction(d, d.handle)
	}
	w.b.syncRecord(d.uuid)
	// Schedule before sending, so that a receiver of the event finds the
	// probe timer already set on the clock.
	w.schedule(d)
	if !wasFaulty {
		w.send(vgpu.HealthEvent{UUID: d.uuid, Health: vgpu.Unhealthy, Reason: reason})
	}
}

// probeDevice checks whether an unhealthy GPU answers NVML again (and, for
// a reset-required fault, was reset).
func (w *watcher) probeDevice(d *watchedDevice) {
	err := w.probe(d)
	if err != nil {
		w.b.syncRecord(d.uuid) // the probe may have seen the GPU down
		w.logger.Info("GPU still unhealthy; probing again after the cool-down", "gpu", d.uuid, "err", err, "coolDown", w.b.coolDown)
		w.schedule(d)
		return
	}
	d.probe = nil
	w.b.mu.Lock()
	f := w.b.faults[d.uuid]
	delete(w.b.faults, d.uuid)
	w.b.mu.Unlock()
	w.b.syncRecord(d.uuid)
	how := "GPU answers NVML again after "
	if f.resetRequired {
		how = "GPU was reset after "
	}
	w.logger.Info("GPU healthy again", "gpu", d.uuid, "after", f.reason, "reset", f.resetRequired)
	w.send(vgpu.HealthEvent{UUID: d.uuid, Health: vgpu.Healthy, Reason: how + f.reason})
}

func (w *watcher) probe(d *watchedDevice) error {
	dev, ret := w.b.lib.DeviceGetHandleByUUID(d.uuid)
	if ret != nvml.SUCCESS {
		w.sawDown(d)
		return fmt.Errorf("GPU %d: NVML get handle by UUID: %w", d.index, ret)
	}
	if _, ret := dev.GetMemoryInfo(); ret != nvml.SUCCESS {
		w.sawDown(d)
		return fmt.Errorf("GPU %d: NVML get memory info: %w", d.index, ret)
	}
	if err := w.checkReset(d, dev); err != nil {
		return err
	}
	d.handle = dev
	if !d.registered {
		// Best effort: a GPU that answers is healthy even if it cannot be
		// watched.
		if err := w.register(d); err != nil {
			w.logger.Error(err, "Cannot watch GPU for XID events", "gpu", d.uuid, "index", d.index)
		}
	}
	return nil
}

// schedule starts d's CoolDown, replacing a pending one. The timer is set
// on the clock before schedule returns.
func (w *watcher) schedule(d *watchedDevice) {
	var gen uint64
	if d.probe != nil {
		gen = d.probe.gen + 1
		d.probe.timer.Stop()
		close(d.probe.stop)
	}
	p := &probeTimer{gen: gen, timer: w.b.clock.NewTimer(w.b.coolDown), stop: make(chan struct{})}
	d.probe = p
	w.goroutines.Add(1)
	go w.awaitProbe(p.timer, probeDue{uuid: d.uuid, gen: gen}, p.stop)
}

func (w *watcher) awaitProbe(t clock.Timer, due probeDue, stop <-chan struct{}) {
	defer w.goroutines.Done()
	defer t.Stop()
	select {
	case <-t.C():
	case <-stop:
		return
	case <-w.ctx.Done():
		return
	}
	select {
	case w.probes <- due:
	case <-stop:
	case <-w.ctx.Done():
	}
}

// send delivers ev unless ctx ends first.
func (w *watcher) send(ev vgpu.HealthEvent) {
	select {
	case w.events <- ev:
	case <-w.ctx.Done():
	}
}

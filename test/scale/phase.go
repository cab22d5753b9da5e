package scale

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/test/cluster"
)

// Defaults of Phase.
const (
	// DefaultPhaseTimeout bounds a phase's wait for its pods to be bound.
	DefaultPhaseTimeout = 5 * time.Minute
	// progressEvery is how often a waiting phase logs its progress.
	progressEvery = 10 * time.Second
)

// Phase is one batch of pods sent through the scheduler at once.
type Phase struct {
	// Name is the value of the pods' LabelPhase; it must be unique per harness.
	Name string
	// Pods are created in order, as fast as Config.Workers requests in flight allow, in the
	// harness's namespace and with LabelPhase set (the given objects are not changed).
	Pods []*corev1.Pod
	// Timeout bounds the wait for every pod to be bound, counted from the first create; 0 means
	// DefaultPhaseTimeout. A phase that runs out reports what was bound by then.
	Timeout time.Duration
}

// PhaseResult is what one phase measured.
type PhaseResult struct {
	// Name is the phase's.
	Name string
	// Pods is how many were created; Bound how many were bound before the deadline;
	// Unschedulable how many of the rest kube-scheduler last marked unschedulable.
	Pods, Bound, Unschedulable int
	// CreateTime is from the first create to the last create's answer; Elapsed from the first
	// create to the last pod bound, or to the deadline when TimedOut.
	CreateTime, Elapsed time.Duration
	TimedOut            bool
	// API counts the API server's requests during the phase, by kind.
	API Requests
	// ExtenderDurations is the extender's request-duration histogram of the phase, by verb;
	// Binds its Bind calls by result (extender.BindSuccess, …).
	ExtenderDurations map[string]histogram
	Binds             map[string]float64
	// Memory is each control-plane process's memory right after the phase, by name;
	// ExtenderHeapMiB the extender's Go heap in use then, and ExtenderGoMiB the rest of its Go
	// runtime's memory gauges (heap idle and released, stacks, sys, next GC), in MiB by name.
	Memory          map[string]Memory
	ExtenderHeapMiB float64
	ExtenderGoMiB   map[string]float64
	// CPU is the CPU time each control-plane process used during the phase, by name: where a
	// phase's time goes when the machine's cores, not a rate limit, bound it.
	CPU map[string]time.Duration
}

// CPUPerBound is name's CPU time of the phase per bound pod; 0 when none was bound.
func (r PhaseResult) CPUPerBound(name string) time.Duration {
	if r.Bound == 0 {
		return 0
	}
	return r.CPU[name] / time.Duration(r.Bound)
}

// PodsPerSecond is Bound over Elapsed.
func (r PhaseResult) PodsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bound) / r.Elapsed.Seconds()
}

// Memory is one process's resident memory now and at its peak, in KiB, and how the resident
// memory now divides between anonymous pages and pages of mapped files (Process.ResidentSplit).
type Memory struct {
	RSSKiB, PeakKiB  int64
	AnonKiB, FileKiB int64
}

// RunPhase creates the phase's pods and waits until all are bound or the phase's timeout
// passes, scraping the API server's and the extender's metrics before and after. Only errors of
// the harness itself (a create refused, a scrape failing) are returned.
func (h *Harness) RunPhase(ctx context.Context, p Phase) (PhaseResult, error) {
	res := PhaseResult{Name: p.Name, Pods: len(p.Pods)}
	timeout := p.Timeout
	if timeout == 0 {
		timeout = DefaultPhaseTimeout
	}
	apiBefore, err := ScrapeAPIRequests(ctx, h.client)
	if err != nil {
		return res, err
	}
	extBefore, err := scrapeExtender(ctx, h.Cluster.ExtenderURL()+"/metrics")
	if err != nil {
		return res, err
	}
	cpuBefore := h.cpuTimes()
	h.watch.expect(p.Name)
	start := time.Now()
	if err := h.create(ctx, p.Name, p.Pods); err != nil {
		return res, err
	}
	res.CreateTime = time.Since(start)
	h.cfg.Logf("phase %s: %d pods created in %v", p.Name, len(p.Pods), res.CreateTime.Round(time.Millisecond))

	pr := h.cfg.Progress
	if pr != nil {
		pr.Stage(fmt.Sprintf("phase %s on %d nodes", p.Name, len(h.cfg.Nodes)), len(p.Pods), "pods bound")
	}
	res.TimedOut = !h.watch.waitBound(ctx, p.Name, len(p.Pods), start.Add(timeout), pr != nil, func(bound, unschedulable int) {
		if pr != nil {
			pr.Set(bound, fmt.Sprintf("%d unschedulable", unschedulable))
			return
		}
		h.cfg.Logf("phase %s: %d/%d bound, %d unschedulable after %v", p.Name, bound, len(p.Pods), unschedulable, time.Since(start).Round(time.Second))
	})
	if err := ctx.Err(); err != nil {
		return res, err
	}
	st := h.watch.phase(p.Name)
	res.Bound, res.Unschedulable = st.bound, st.unschedulable
	res.Elapsed = st.lastBound.Sub(start)
	if res.TimedOut {
		res.Elapsed = timeout
	}

	apiAfter, err := ScrapeAPIRequests(ctx, h.client)
	if err != nil {
		return res, err
	}
	extAfter, err := scrapeExtender(ctx, h.Cluster.ExtenderURL()+"/metrics")
	if err != nil {
		return res, err
	}
	res.API = apiAfter.Sub(apiBefore)
	res.ExtenderDurations = map[string]histogram{}
	for verb, hist := range extAfter.durations {
		res.ExtenderDurations[verb] = hist.sub(extBefore.durations[verb])
	}
	res.Binds = map[string]float64{}
	for result, n := range extAfter.binds {
		res.Binds[result] = n - extBefore.binds[result]
	}
	res.Memory = h.Memory()
	res.ExtenderHeapMiB = extAfter.heapInuseBytes / (1 << 20)
	res.ExtenderGoMiB = map[string]float64{}
	for name, v := range extAfter.goMemory {
		res.ExtenderGoMiB[name] = v / (1 << 20)
	}
	res.CPU = map[string]time.Duration{}
	for name, after := range h.cpuTimes() {
		if before, ok := cpuBefore[name]; ok {
			res.CPU[name] = after - before
		}
	}
	return res, nil
}

// controlPlane names the processes whose memory and CPU a phase reports.
func controlPlane() []string {
	return []string{cluster.ExtenderName, "kube-scheduler", "kube-apiserver", "etcd", cluster.WebhookName}
}

// cpuTimes returns the CPU time the control-plane processes have used so far, by name.
func (h *Harness) cpuTimes() map[string]time.Duration {
	all := h.Cluster.CPUTimes()
	out := map[string]time.Duration{}
	for _, name := range controlPlane() {
		if t, ok := all[name]; ok {
			out[name] = t
		}
	}
	return out
}

// Memory returns the resident memory of the control-plane processes by name.
func (h *Harness) Memory() map[string]Memory {
	out := map[string]Memory{}
	for _, name := range controlPlane() {
		if p := h.Cluster.Process(name); p != nil {
			rss, peak, err := p.Memory()
			if err != nil {
				continue
			}
			m := Memory{RSSKiB: rss, PeakKiB: peak}
			if anon, file, err := p.ResidentSplit(); err == nil {
				m.AnonKiB, m.FileKiB = anon, file
			}
			out[name] = m
		}
	}
	return out
}

// DeletePhase deletes the phase's pods (grace period 0: no kubelet would confirm), one request
// per pod with Config.Workers in flight (a DeleteCollection of 5,000 bound pods outlasts the API
// server's request timeout), and waits until the harness's watch has seen them all go.
func (h *Harness) DeletePhase(ctx context.Context, name string) error {
	pods := h.watch.pods(name)
	err := parallel(ctx, len(pods), h.cfg.Workers, func(ctx context.Context, i int) error {
		p := pods[i]
		err := h.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("phase %s: delete pod %s: %w", name, p.Name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return waitUntil(ctx, 2*time.Minute, "the pods of phase "+name+" to go", func(context.Context) (bool, error) {
		return h.watch.phase(name).present == 0, nil
	})
}

// waitUntil polls cond every 200 ms until it holds, fails, or timeout (or ctx) ends.
func waitUntil(ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) error {
	began := time.Now()
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, cond); err != nil {
		return fmt.Errorf("wait for %s (%v): %w", what, time.Since(began).Round(time.Millisecond), err)
	}
	return nil
}

// podWatch follows the harness's pods through one informer and keeps, per phase, how many exist,
// how many were seen bound and when the last was, and which are marked unschedulable.
type podWatch struct {
	informer cache.SharedIndexInformer
	// changed gets a value (without blocking) after every event that changed a count.
	changed chan struct{}

	mu     sync.Mutex
	phases map[string]*phaseState
	// bound holds the pods seen bound, so that each counts once.
	bound map[types.UID]bool
	// unschedulable holds the unbound pods whose PodScheduled condition says Unschedulable.
	unschedulable map[types.UID]string
}

// phaseState is one phase's counts.
type phaseState struct {
	present, bound, unschedulable int
	lastBound                     time.Time
}

// watchPods starts the informer on namespace's pods and waits for its first list.
func watchPods(ctx context.Context, client kubernetes.Interface, namespace string) (*podWatch, error) {
	w := &podWatch{changed: make(chan struct{}, 1), phases: map[string]*phaseState{}, bound: map[types.UID]bool{}, unschedulable: map[types.UID]string{}}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace))
	w.informer = factory.Core().V1().Pods().Informer()
	_, err := w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.update(obj, true) },
		UpdateFunc: func(_, obj any) { w.update(obj, false) },
		DeleteFunc: w.remove,
	})
	if err != nil {
		return nil, fmt.Errorf("pod watch: %w", err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
		return nil, fmt.Errorf("pod watch: cache did not sync: %w", ctx.Err())
	}
	return w, nil
}

// expect makes sure phase has counts, so that a wait reads zeros rather than nothing.
func (w *podWatch) expect(phase string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stateLocked(phase)
}

func (w *podWatch) stateLocked(phase string) *phaseState {
	s := w.phases[phase]
	if s == nil {
		s = &phaseState{}
		w.phases[phase] = s
	}
	return s
}

// phase returns a copy of phase's counts.
func (w *podWatch) phase(phase string) phaseState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return *w.stateLocked(phase)
}

func (w *podWatch) update(obj any, added bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	w.mu.Lock()
	s := w.stateLocked(pod.Labels[LabelPhase])
	if added {
		s.present++
	}
	_, wasUnschedulable := w.unschedulable[pod.UID]
	switch {
	case pod.Spec.NodeName != "" && !w.bound[pod.UID]:
		w.bound[pod.UID] = true
		s.bound++
		s.lastBound = now
		if wasUnschedulable {
			delete(w.unschedulable, pod.UID)
			s.unschedulable--
		}
	case pod.Spec.NodeName == "" && unschedulable(pod) != wasUnschedulable:
		if wasUnschedulable {
			delete(w.unschedulable, pod.UID)
			s.unschedulable--
		} else {
			w.unschedulable[pod.UID] = pod.Labels[LabelPhase]
			s.unschedulable++
		}
	}
	w.mu.Unlock()
	w.signal()
}

func (w *podWatch) remove(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	s := w.stateLocked(pod.Labels[LabelPhase])
	s.present--
	if _, ok := w.unschedulable[pod.UID]; ok {
		delete(w.unschedulable, pod.UID)
		s.unschedulable--
	}
	w.mu.Unlock()
	w.signal()
}

func (w *podWatch) signal() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// unschedulable reports whether kube-scheduler's last word on pod is Unschedulable.
func unschedulable(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
		}
	}
	return false
}

// waitBound waits until want pods of phase are bound, deadline passes or ctx ends, calling
// progress every progressEvery. It reports whether all were bound. Only one waiter may use w at
// a time (it drains w.changed).
// With live, progress is also called on every change (a progress.Reporter limits its own rate).
func (w *podWatch) waitBound(ctx context.Context, phase string, want int, deadline time.Time, live bool, progress func(bound, unschedulable int)) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	ticker := time.NewTicker(progressEvery)
	defer ticker.Stop()
	for {
		s := w.phase(phase)
		if s.bound >= want {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return false
		case <-ticker.C:
			progress(s.bound, s.unschedulable)
		case <-w.changed:
			if live {
				progress(s.bound, s.unschedulable)
			}
		}
	}
}

// pods returns the pods of phase in the watch's cache.
func (w *podWatch) pods(phase string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, obj := range w.informer.GetStore().List() {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Labels[LabelPhase] == phase {
			out = append(out, pod)
		}
	}
	return out
}

// waitPod waits until the pod with uid is bound or marked unschedulable, deadline passes or ctx
// ends, and says which. Only one waiter may use w at a time (it drains w.changed).
func (w *podWatch) waitPod(ctx context.Context, uid types.UID, deadline time.Time) (bound, unschedulable bool) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		w.mu.Lock()
		bound = w.bound[uid]
		_, unschedulable = w.unschedulable[uid]
		w.mu.Unlock()
		if bound || unschedulable {
			return bound, unschedulable
		}
		select {
		case <-ctx.Done():
			return false, false
		case <-timer.C:
			return false, false
		case <-w.changed:
		}
	}
}

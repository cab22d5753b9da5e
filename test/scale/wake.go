package scale

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuslice/gpuslice/vgpu"
)

// wakeQuiet is how long Wake waits for retries that should not come: a few of the extender's
// retry passes (two seconds after a change).
const wakeQuiet = 6 * time.Second

// WakeResult is what Wake measured of the extender's targeted retries.
type WakeResult struct {
	// Waiters is how many pods waited for room on the full node.
	Waiters int
	// ElsewhereRetries and ElsewherePatches are the retries the extender asked for, and the
	// pod PATCH requests the API server served, after a whole GPU was freed on another node:
	// the waiters were not turned away there, so 0 is right.
	ElsewhereRetries, ElsewherePatches float64
	// Retries and Patches are the same after a whole GPU was freed on the waiters' node, and
	// Bound how many waiters were then bound (two fit the GPU freed).
	Retries, Patches float64
	Bound            int
}

// WritesPerWoken is the pod PATCH requests per pod woken on the waiters' node.
func (r WakeResult) WritesPerWoken() float64 {
	if r.Retries == 0 {
		return 0
	}
	return r.Patches / r.Retries
}

// Wake measures targeted retries on two hollow nodes, target and other, that hold nothing
// yet: it fills every GPU of both with one whole-memory slice each, makes waiters pods that
// ask for half a GPU wait for target (node selector), frees a GPU on other (nothing should
// wake), then frees one on target (the waiters should be asked to retry, one write each, and
// two bound). Its pods are left behind.
func (h *Harness) Wake(ctx context.Context, target, other string, gpus, waiters int) (WakeResult, error) {
	res := WakeResult{Waiters: waiters}
	pinned := func(name, node string, percent int) *corev1.Pod {
		p := pod(name, corev1.ResourceList{
			vgpu.ResourceGPU:              *resource.NewQuantity(1, resource.DecimalSI),
			vgpu.ResourceMemoryPercentage: *resource.NewQuantity(int64(percent), resource.DecimalSI),
		})
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
		return p
	}
	var fill []*corev1.Pod
	for i := range gpus {
		fill = append(fill, pinned(fmt.Sprintf("wake-fill-t-%02d", i), target, 100), pinned(fmt.Sprintf("wake-fill-o-%02d", i), other, 100))
	}
	if r, err := h.RunPhase(ctx, Phase{Name: "wake-fill", Pods: fill, Timeout: time.Minute}); err != nil {
		return res, err
	} else if r.Bound != len(fill) {
		return res, fmt.Errorf("wake: %d of %d fillers bound", r.Bound, len(fill))
	}
	var wait []*corev1.Pod
	for i := range waiters {
		wait = append(wait, pinned(fmt.Sprintf("wake-wait-%02d", i), target, 50))
	}
	if err := h.createWaiting(ctx, "wake-wait", wait); err != nil {
		return res, err
	}
	deleteFiller := func(name string) func() error {
		return func() error {
			err := h.client.CoreV1().Pods(h.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("wake: delete %s: %w", name, err)
			}
			return nil
		}
	}
	var err error
	if res.ElsewhereRetries, res.ElsewherePatches, err = h.measureChange(ctx, deleteFiller("wake-fill-o-00")); err != nil {
		return res, err
	}
	if res.Retries, res.Patches, err = h.measureChange(ctx, deleteFiller("wake-fill-t-00")); err != nil {
		return res, err
	}
	if err := waitUntil(ctx, time.Minute, "two waiters bound in the GPU freed", func(context.Context) (bool, error) {
		return h.watch.phase("wake-wait").bound >= 2, nil
	}); err != nil {
		return res, err
	}
	res.Bound = h.watch.phase("wake-wait").bound
	return res, nil
}

// WakeHeartbeat measures targeted retries for a change kube-scheduler cannot see: two hollow
// nodes' plugins stop renewing their heartbeat Leases (renewTime ten minutes back), waiters pods
// that ask for a tenth of a GPU wait for target ("plugin not ready"), other's heartbeat comes
// back (nothing should wake), then target's (each waiter should be asked to retry once, and all
// bound). It returns the same figures as Wake: Elsewhere* for other, the rest for target.
func (h *Harness) WakeHeartbeat(ctx context.Context, target, other string, waiters int) (WakeResult, error) {
	res := WakeResult{Waiters: waiters}
	setHeartbeat := func(node string, at time.Time, pause bool) error {
		return h.heartbeats.setRenewTime(ctx, vgpu.HeartbeatLeaseName(node), at, pause)
	}
	stale := time.Now().Add(-10 * time.Minute)
	for _, n := range []string{target, other} {
		if err := setHeartbeat(n, stale, true); err != nil {
			return res, err
		}
	}
	var wait []*corev1.Pod
	for i := range waiters {
		p := pod(fmt.Sprintf("wake-hb-%02d", i), corev1.ResourceList{
			vgpu.ResourceGPU:              *resource.NewQuantity(1, resource.DecimalSI),
			vgpu.ResourceMemoryPercentage: *resource.NewQuantity(10, resource.DecimalSI),
		})
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: target}
		wait = append(wait, p)
	}
	if err := h.createWaiting(ctx, "wake-hb", wait); err != nil {
		return res, err
	}
	var err error
	if res.ElsewhereRetries, res.ElsewherePatches, err = h.measureChange(ctx, func() error { return setHeartbeat(other, time.Now(), false) }); err != nil {
		return res, err
	}
	if res.Retries, res.Patches, err = h.measureChange(ctx, func() error { return setHeartbeat(target, time.Now(), false) }); err != nil {
		return res, err
	}
	if err := waitUntil(ctx, time.Minute, "the waiters bound once the heartbeat is back", func(context.Context) (bool, error) {
		return h.watch.phase("wake-hb").bound == waiters, nil
	}); err != nil {
		return res, err
	}
	res.Bound = h.watch.phase("wake-hb").bound
	return res, nil
}

// measureChange runs change, lets the extender's retry passes go by, and returns the retries
// it asked for and the pod PATCH requests the API server served meanwhile.
func (h *Harness) measureChange(ctx context.Context, change func() error) (retries, patches float64, err error) {
	// Retries of earlier changes (deleted pods, a Filter that raced one) land within a pass or
	// two: wait until the counter holds still, so they are not taken for this change's.
	// The last scrape of that wait is the count before the change.
	var extBefore extenderScrape
	since := time.Now()
	if err := waitUntil(ctx, time.Minute, "the extender's retries to settle", func(ctx context.Context) (bool, error) {
		ext, err := scrapeExtender(ctx, h.Cluster.ExtenderURL()+"/metrics")
		if err != nil {
			return false, err
		}
		if ext.retries != extBefore.retries || extBefore.durations == nil {
			since = time.Now()
		}
		extBefore = ext
		return time.Since(since) >= wakeQuiet/2, nil
	}); err != nil {
		return 0, 0, err
	}
	apiBefore, err := ScrapeAPIRequests(ctx, h.client)
	if err != nil {
		return 0, 0, err
	}
	if err := change(); err != nil {
		return 0, 0, err
	}
	select {
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-time.After(wakeQuiet): // the absence of retries is what is measured
	}
	apiAfter, err := ScrapeAPIRequests(ctx, h.client)
	if err != nil {
		return 0, 0, err
	}
	extAfter, err := scrapeExtender(ctx, h.Cluster.ExtenderURL()+"/metrics")
	if err != nil {
		return 0, 0, err
	}
	d := apiAfter.Sub(apiBefore)
	return extAfter.retries - extBefore.retries, d[Request{Verb: "PATCH", Resource: "pods"}], nil
}

// createWaiting creates pods as phase and waits until kube-scheduler has marked every one
// unschedulable.
func (h *Harness) createWaiting(ctx context.Context, phase string, pods []*corev1.Pod) error {
	h.watch.expect(phase)
	if err := h.create(ctx, phase, pods); err != nil {
		return err
	}
	return waitUntil(ctx, time.Minute, "the pods of phase "+phase+" turned away", func(context.Context) (bool, error) {
		return h.watch.phase(phase).unschedulable == len(pods), nil
	})
}

// CreateBound creates pods already bound to the hollow nodes in turn (spec.nodeName set, so
// that no scheduler sees them but as assigned pods), with LabelPhase phase, and waits until the
// harness's watch has seen them all.
func (h *Harness) CreateBound(ctx context.Context, phase string, pods []*corev1.Pod) error {
	bound := make([]*corev1.Pod, len(pods))
	for i, p := range pods {
		bound[i] = p.DeepCopy()
		bound[i].Spec.NodeName = h.cfg.Nodes[i%len(h.cfg.Nodes)].Name
	}
	h.watch.expect(phase)
	start := time.Now()
	if err := h.create(ctx, phase, bound); err != nil {
		return err
	}
	if err := waitUntil(ctx, time.Minute, "the watch to see the pods of phase "+phase, func(context.Context) (bool, error) {
		return h.watch.phase(phase).bound == len(pods), nil
	}); err != nil {
		return err
	}
	h.cfg.Logf("phase %s: %d pods created bound in %v", phase, len(pods), time.Since(start).Round(time.Millisecond))
	return nil
}

// create creates pods in the harness's namespace with LabelPhase phase, Config.Workers
// requests in flight.
func (h *Harness) create(ctx context.Context, phase string, pods []*corev1.Pod) error {
	return parallel(ctx, len(pods), h.cfg.Workers, func(ctx context.Context, i int) error {
		p := pods[i].DeepCopy()
		p.Namespace = h.cfg.Namespace
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[LabelPhase] = phase
		if _, err := h.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("phase %s: create pod %s: %w", phase, p.Name, err)
		}
		return nil
	})
}

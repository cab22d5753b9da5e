package soak

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// recoverTimeout bounds the wait for every node to be back once the chaos stops: GPU resets
// applied, the re-probe after the cool-down, the inventory and allocatable published.
const recoverTimeout = 90 * time.Second

// fillPercent is the memory share of each pod of the fill: with four slices per GPU, the fill
// takes every slice and all memory of every GPU.
const fillPercent = 25

// settle runs the checks after the chaos: every GPU reset and every node back; every pod that
// fits Running; every pod deleted with nothing left held; the freed slices all taken again.
func (s *soak) settle(ctx context.Context) {
	s.superviseNow()
	if err := s.recoverNodes(ctx); err != nil {
		s.tally.violate(InvariantRecovered, "nodes", fmt.Sprintf("nodes not back within %v of the chaos end: %v", recoverTimeout, err))
	}
	s.waitFitRunning(ctx)
	s.check(ctx, s.rc)
	s.opts.Logf("after the chaos: %s", s.tally.brief())

	if err := s.deleteAll(ctx); err != nil {
		s.tally.violate(InvariantSettled, "delete", err.Error())
		return
	}
	s.checkNothingHeld(ctx)
	s.fill(ctx)
	s.check(ctx, s.rc)
	if err := s.deleteAll(ctx); err != nil {
		s.tally.violate(InvariantSettled, "delete fill", err.Error())
	}
}

// recoverNodes resets every fake GPU and waits until every node's plugin is registered with
// every GPU healthy in its inventory and all its devices allocatable.
func (s *soak) recoverNodes(ctx context.Context) error {
	for _, n := range s.c.Nodes {
		gpus, err := nvidia.ParseFakeSpec(n.FakeGPUs)
		if err != nil {
			return err
		}
		for i := range gpus {
			if err := s.inject(n, nvidia.FakeFault{GPU: i, Reset: true}); err != nil {
				return err
			}
		}
	}
	last := ""
	err := wait.PollUntilContextTimeout(ctx, time.Second, recoverTimeout, true, func(ctx context.Context) (bool, error) {
		for _, n := range s.c.Nodes {
			node, inv, err := s.c.NodeInventory(ctx, n.Name)
			if err != nil {
				last = err.Error()
				return false, nil
			}
			healthy := 0
			for _, g := range inv.GPUs {
				if g.Health == vgpu.Healthy {
					healthy++
				}
			}
			alloc := node.Status.Allocatable[cluster.ResourceGPU]
			want := int64(len(inv.GPUs) * inv.SplitCount)
			if node.Labels[cluster.LabelGPUReady] != "true" || healthy != len(inv.GPUs) || alloc.Value() != want {
				last = fmt.Sprintf("%s: ready label %q, %d of %d GPUs healthy, allocatable %d of %d", n.Name, node.Labels[cluster.LabelGPUReady], healthy, len(inv.GPUs), alloc.Value(), want)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last: %s)", err, last)
	}
	return nil
}

// waitFitRunning deletes the pods a kubelet failed, then waits up to settleTimeout until every
// pod is Running or unbound and fits no node (vgpu.Fit over what the bound pods hold). Each pod
// that does not get there is a violation.
func (s *soak) waitFitRunning(ctx context.Context) {
	pods := s.c.Client().CoreV1().Pods(s.ns)
	var unsettled map[string]string
	running := 0
	_ = wait.PollUntilContextTimeout(ctx, time.Second, settleTimeout, true, func(ctx context.Context) (bool, error) {
		s.superviseNow()
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling: the wait's end reports what is left
		}
		holding := holdingPods(list.Items)
		unsettled, running = map[string]string{}, 0
		for i := range list.Items {
			p := &list.Items[i]
			switch {
			case p.Status.Phase == corev1.PodFailed:
				s.deleteFailed(ctx, p)
			case p.Status.Phase == corev1.PodRunning:
				running++
			case p.Spec.NodeName == "":
				if node, ok := s.fitsSomewhere(ctx, p, holding); ok {
					unsettled[p.Name] = "Pending though it fits " + node
				}
			default:
				unsettled[p.Name] = fmt.Sprintf("%s on %s, conditions %s", p.Status.Phase, p.Spec.NodeName, conditions(p))
			}
		}
		return len(unsettled) == 0, nil
	})
	s.tally.add(func(r *Report) { r.RunningAtEnd = running })
	if len(unsettled) == 0 {
		return
	}
	failed, _ := s.c.FailedScheduling(ctx, s.ns)
	list, _ := pods.List(ctx, metav1.ListOptions{})
	for _, p := range list.Items {
		if why, ok := unsettled[p.Name]; ok {
			s.tally.violate(InvariantSettled, string(p.UID), fmt.Sprintf("pod %s (UID %s, limits %v) not Running %v after the chaos: %s; last FailedScheduling: %q; events %v",
				p.Name, p.UID, limitsOf(&p), settleTimeout, why, failed[p.UID], s.seen.eventReasons(p.UID)))
		}
	}
}

// fitsSomewhere returns a node that pod fits on, given what holding (the bound pods) holds.
func (s *soak) fitsSomewhere(ctx context.Context, pod *corev1.Pod, holding []corev1.Pod) (string, bool) {
	req, err := vgpu.RequestFromPod(pod)
	if err != nil {
		return "", false
	}
	cons, err := vgpu.ConstraintsFromPod(pod)
	if err != nil {
		return "", false
	}
	for _, n := range s.c.Nodes {
		_, inv, err := s.c.NodeInventory(ctx, n.Name)
		if err != nil {
			continue
		}
		usage := &vgpu.NodeUsage{}
		for i := range holding {
			h := &holding[i]
			if h.Spec.NodeName != n.Name {
				continue
			}
			alloc, aerr := vgpu.ParsePodAllocation(h.Annotations[vgpu.AnnotationPodAllocation])
			hreq, rerr := vgpu.RequestFromPod(h)
			if aerr == nil && rerr == nil {
				usage.Add(alloc, hreq)
			}
		}
		demand := vgpu.PodDemand{Request: req, Constraints: cons}
		if _, err := vgpu.Fit(demand, vgpu.NodeState{Inventory: inv, Usage: usage}, vgpu.FitOptions{Unscored: true, ReasonOnly: true, NoAllocation: true}); err == nil {
			return n.Name, true
		}
	}
	return "", false
}

// limitsOf renders the limits of p's containers.
func limitsOf(p *corev1.Pod) string {
	var parts []string
	for _, c := range p.Spec.Containers {
		var l []string
		for k, v := range c.Resources.Limits {
			l = append(l, string(k)+"="+v.String())
		}
		parts = append(parts, c.Name+":"+strings.Join(l, ","))
	}
	return strings.Join(parts, " ")
}

// deleteAll deletes every pod of the namespace at once and waits up to settleTimeout until none
// is left.
func (s *soak) deleteAll(ctx context.Context) error {
	pods := s.c.Client().CoreV1().Pods(s.ns)
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete pods: %w", err)
	}
	s.tally.add(func(r *Report) { r.Deleted += len(list.Items) })
	left := 0
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, settleTimeout, true, func(ctx context.Context) (bool, error) {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		left = len(list.Items)
		return left == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%d pods still there %v after deleting them all: %w", left, settleTimeout, err)
	}
	return nil
}

// heldCatchUp bounds how long the extender's informer may take to see the deletions: after the
// API server was stopped several times in a row, client-go's reflector waits between 30 and 60 s
// (its back-off cap, with jitter) before it lists and watches again, and until then the extender
// keeps counting the deleted pods' slices as held (the safe direction: nothing is given twice).
// A reservation that is still counted after that is leaked.
const heldCatchUp = 75 * time.Second

// checkNothingHeld waits up to heldCatchUp until the extender counts nothing held on any GPU;
// each GPU it still counts is a leaked reservation. A catch-up slower than 10 s is logged.
func (s *soak) checkNothingHeld(ctx context.Context) {
	var held []string // from the latest scrape that answered
	var scrapeErr error
	began := time.Now()
	defer func() {
		if took := time.Since(began); took > 10*time.Second {
			s.opts.Logf("the extender took %v to count nothing held after every pod was deleted (its informer backing off after API server restarts)", took.Round(time.Second))
		}
	}()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, heldCatchUp, true, func(ctx context.Context) (bool, error) {
		got, err := s.c.ExtenderHeld(ctx)
		if err != nil {
			// The poll's own deadline cuts the last scrape short: keep
			// what the one before found.
			scrapeErr = err
			return false, nil
		}
		held, scrapeErr = got, nil
		return len(held) == 0, nil
	})
	if err == nil {
		return
	}
	if len(held) == 0 {
		held = []string{fmt.Sprintf("the extender's metrics could not be read: %v", scrapeErr)}
	}
	for _, h := range held {
		s.tally.violate(InvariantNoLeak, h, "with no pod left, the extender still counts "+h)
	}
}

// fill creates one pod per slice of the cluster, each a quarter of a GPU's memory, and waits up
// to settleTimeout until all are Running: every freed slice, memory and kubelet device is
// usable again. Each pod that does not run is a violation.
func (s *soak) fill(ctx context.Context) {
	total := 0
	for _, n := range s.c.Nodes {
		_, inv, err := s.c.NodeInventory(ctx, n.Name)
		if err != nil {
			s.tally.violate(InvariantReusable, "inventory "+n.Name, err.Error())
			return
		}
		total += len(inv.GPUs) * inv.SplitCount
	}
	pods := s.c.Client().CoreV1().Pods(s.ns)
	for i := range total {
		p := gpuPod(s.ns, fmt.Sprintf("fill-%03d", i), corev1.ResourceList{vgpu.ResourceMemoryPercentage: q(fillPercent)})
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			s.tally.violate(InvariantReusable, p.Name, fmt.Sprintf("create %s: %v", p.Name, err))
			return
		}
	}
	s.tally.add(func(r *Report) { r.Created += total })
	var notRunning []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, settleTimeout, true, func(ctx context.Context) (bool, error) {
		s.superviseNow()
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		notRunning = notRunning[:0]
		for _, p := range list.Items {
			if p.Status.Phase != corev1.PodRunning {
				notRunning = append(notRunning, p)
			}
		}
		return len(notRunning) == 0, nil
	})
	if err == nil {
		s.opts.Logf("fill: all %d slices of the cluster Running again", total)
		return
	}
	failed, ferr := s.c.FailedScheduling(ctx, s.ns)
	for _, p := range notRunning {
		s.tally.violate(InvariantReusable, string(p.UID), fmt.Sprintf("fill pod %s (one of %d, a quarter GPU each) %s on %q %v after the cluster was emptied: last FailedScheduling %q; events %v",
			p.Name, total, p.Status.Phase, p.Spec.NodeName, settleTimeout, failed[p.UID], s.seen.eventReasons(p.UID)))
	}
	if ferr != nil {
		s.tally.violate(InvariantReusable, "events", errors.Join(errors.New("read FailedScheduling events"), ferr).Error())
	}
}

package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuslice/gpuslice/vgpu"
)

// shape is one kind of pod the driver creates.
type shape struct {
	name string
	// weight is how often it is picked, relative to the others.
	weight int
	// neverFits says no node of Nodes can hold it.
	neverFits bool
	// limits returns one container's limits.
	limits func(rng *rand.Rand) corev1.ResourceList
}

// q is a plain integer quantity.
func q(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }

// pick returns one of values at random.
func pick[T any](rng *rand.Rand, values ...T) T { return values[rng.IntN(len(values))] }

// shapes are the pods of the run: slices of every size the models hold (the webhook adds
// hami.io/gpu: 1), percentages, whole GPUs, two GPUs, and two that never fit: more memory than
// any GPU has, and more GPUs than any node has.
var shapes = []shape{
	{name: "slice", weight: 10, limits: func(rng *rand.Rand) corev1.ResourceList {
		l := corev1.ResourceList{vgpu.ResourceMemory: q(pick[int64](rng, 1024, 2048, 4096, 8192, 12288, 20480, 40960))}
		if c := pick[int64](rng, 0, 0, 10, 25, 50); c > 0 {
			l[vgpu.ResourceCores] = q(c)
		}
		return l
	}},
	{name: "percent", weight: 3, limits: func(rng *rand.Rand) corev1.ResourceList {
		return corev1.ResourceList{vgpu.ResourceMemoryPercentage: q(pick[int64](rng, 25, 50))}
	}},
	{name: "whole", weight: 2, limits: func(*rand.Rand) corev1.ResourceList {
		return corev1.ResourceList{vgpu.ResourceGPU: q(1)}
	}},
	{name: "two", weight: 2, limits: func(rng *rand.Rand) corev1.ResourceList {
		return corev1.ResourceList{vgpu.ResourceGPU: q(2), vgpu.ResourceMemory: q(pick[int64](rng, 2048, 8192))}
	}},
	{name: "toobig", weight: 1, neverFits: true, limits: func(*rand.Rand) corev1.ResourceList {
		return corev1.ResourceList{vgpu.ResourceMemory: q(200 * 1024)}
	}},
	{name: "toomany", weight: 1, neverFits: true, limits: func(*rand.Rand) corev1.ResourceList {
		return corev1.ResourceList{vgpu.ResourceGPU: q(3), vgpu.ResourceMemory: q(1024)}
	}},
}

// randomShape picks a shape by weight.
func randomShape(rng *rand.Rand) shape {
	total := 0
	for _, s := range shapes {
		total += s.weight
	}
	n := rng.IntN(total)
	for _, s := range shapes {
		if n < s.weight {
			return s
		}
		n -= s.weight
	}
	return shapes[0]
}

// gpuPod returns a pod of name in ns whose containers have limits; it ends at once when deleted.
func gpuPod(ns, name string, limits ...corev1.ResourceList) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.PodSpec{TerminationGracePeriodSeconds: new(int64)},
	}
	for i, l := range limits {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
			Name:      fmt.Sprintf("c%d", i),
			Image:     "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Limits: l},
		})
	}
	return p
}

// drive keeps about TargetPods pods until ctx ends: it creates pods of random shapes (now and
// then two containers, now and then the name of a pod it just deleted, as a StatefulSet does),
// deletes random ones, and deletes the pods a kubelet failed, as a controller would replace them.
func (s *soak) drive(ctx context.Context, rng *rand.Rand) {
	var recent []string // names of pods deleted lately, for reuse
	next := 0
	for pause(ctx, between(rng, 100*time.Millisecond, 400*time.Millisecond)) {
		pods, err := s.c.Client().CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue // the API server is down
		}
		live := pods.Items[:0]
		for _, p := range pods.Items {
			s.seen.pod(&p) // the informer may be relisting after an API server restart
			if p.Status.Phase == corev1.PodFailed {
				s.deleteFailed(ctx, &p)
				continue
			}
			if p.DeletionTimestamp == nil {
				live = append(live, p)
			}
		}
		if len(live) >= s.opts.TargetPods || (len(live) > 0 && rng.IntN(4) == 0) {
			victim := live[rng.IntN(len(live))]
			if s.delete(ctx, victim.Name) {
				recent = append(recent, victim.Name)
				if len(recent) > 8 {
					recent = recent[1:]
				}
			}
			continue
		}
		name := fmt.Sprintf("soak-%05d", next)
		if len(recent) > 0 && rng.IntN(5) == 0 {
			name, recent = recent[0], recent[1:]
		} else {
			next++
		}
		sh := randomShape(rng)
		limits := []corev1.ResourceList{sh.limits(rng)}
		if !sh.neverFits && rng.IntN(8) == 0 {
			limits = append(limits, corev1.ResourceList{vgpu.ResourceMemory: q(1024)})
		}
		s.create(ctx, gpuPod(s.ns, name, limits...), sh.neverFits)
	}
}

// create creates p and counts the outcome.
func (s *soak) create(ctx context.Context, p *corev1.Pod, neverFits bool) {
	_, err := s.c.Client().CoreV1().Pods(s.ns).Create(ctx, p, metav1.CreateOptions{})
	s.tally.add(func(r *Report) {
		if err != nil {
			r.CreateRefused[refusal(err)]++
			return
		}
		r.Created++
		if neverFits {
			r.NeverFit++
		}
	})
}

// refusal names why a creation failed, in a few words.
func refusal(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "gpuslice"):
		return "webhook unreachable"
	case strings.Contains(msg, "already exists"):
		return "name still taken"
	case strings.Contains(msg, "connection refused"), strings.Contains(msg, "EOF"), strings.Contains(msg, "connection reset"):
		return "API server down"
	default:
		if len(msg) > 60 {
			msg = msg[:60]
		}
		return msg
	}
}

// delete deletes the pod name at once and reports whether it was deleted.
func (s *soak) delete(ctx context.Context, name string) bool {
	err := s.c.Client().CoreV1().Pods(s.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil {
		return false
	}
	s.tally.add(func(r *Report) { r.Deleted++ })
	return true
}

// deleteFailed counts a pod a kubelet failed (tally.failed) and deletes it.
func (s *soak) deleteFailed(ctx context.Context, p *corev1.Pod) {
	if s.delete(ctx, p.Name) {
		s.tally.failed(p, time.Now())
	}
}

// seen is what the informers (and the driver's lists) saw: each pod's latest version with an allocation (kept after the
// pod is deleted, so that its containers' records can still be checked), and the events of each
// pod. Safe for concurrent use.
type seen struct {
	mu sync.Mutex
	// allocated holds, by UID, the latest version of each pod that carried an allocation.
	allocated map[types.UID]*corev1.Pod
	// events holds, by pod UID, the reasons of its events.
	events map[types.UID]map[string]bool
	// deleting holds, by UID, when each pod's deletion was first seen: asked for (its
	// deletionTimestamp less the grace period) or, when the informer saw only its removal,
	// that moment.
	deleting map[types.UID]time.Time
}

func newSeen() *seen {
	return &seen{allocated: map[types.UID]*corev1.Pod{}, events: map[types.UID]map[string]bool{}, deleting: map[types.UID]time.Time{}}
}

// deleted records that an informer saw a pod removed.
func (w *seen) deleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.deleting[p.UID]; !ok {
		w.deleting[p.UID] = time.Now()
	}
}

// deletingSince returns when the pod with uid was first seen being deleted.
func (w *seen) deletingSince(uid types.UID) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.deleting[uid]
	return t, ok
}

// pod records a pod from an informer.
func (w *seen) pod(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Annotations[vgpu.AnnotationPodAllocation] == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.allocated[p.UID] = p
	if _, ok := w.deleting[p.UID]; !ok && p.DeletionTimestamp != nil {
		at := p.DeletionTimestamp.Time
		if g := p.DeletionGracePeriodSeconds; g != nil {
			at = at.Add(-time.Duration(*g) * time.Second)
		}
		w.deleting[p.UID] = at
	}
}

// event records an event from an informer.
func (w *seen) event(obj any) {
	e, ok := obj.(*corev1.Event)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.events[e.InvolvedObject.UID]
	if m == nil {
		m = map[string]bool{}
		w.events[e.InvolvedObject.UID] = m
	}
	m[e.Reason] = true
}

// allocatedPod returns the pod with uid as last seen with an allocation, or nil.
func (w *seen) allocatedPod(uid types.UID) *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.allocated[uid]
}

// eventReasons returns the reasons of the events about the pod with uid.
func (w *seen) eventReasons(uid types.UID) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for r := range w.events[uid] {
		out = append(out, r)
	}
	return out
}

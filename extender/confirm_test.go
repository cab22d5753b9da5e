package extender

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestConfirmBinds binds a pod the pod informer never sees (its watch is
// cut, as during an API server restart), then changes the pod on the API
// server as each case says, and checks what the pod still holds once
// confirmBinds has looked at it: a pod that is gone, replaced by another
// of its name, or finished holds nothing; one still bound, or one that
// cannot be read, keeps its slice and is looked at again.
func TestConfirmBinds(t *testing.T) {
	slice := map[string]vgpu.GPUUsage{"n1-GPU-0": {MemoryMiB: 4096, CoresPercent: 10, Slices: 1}}
	tests := []struct {
		name      string
		change    func(t *testing.T, e *env, pod *corev1.Pod)
		want      map[string]vgpu.GPUUsage
		tracked   bool
		wantFreed float64
	}{
		{name: "still bound", want: slice, tracked: true},
		{name: "deleted", change: deleteFromAPI, want: map[string]vgpu.GPUUsage{}, wantFreed: 1},
		{
			name: "replaced by a pod of its name",
			change: func(t *testing.T, e *env, pod *corev1.Pod) {
				deleteFromAPI(t, e, pod)
				again := slicePod(pod.Name, 4096)
				again.UID = "recreated"
				e.createPod(again)
			},
			want: map[string]vgpu.GPUUsage{}, wantFreed: 1,
		},
		{
			name: "failed at admission",
			change: func(t *testing.T, e *env, pod *corev1.Pod) {
				p := e.getPod(pod)
				p.Status.Phase = corev1.PodFailed
				if _, err := e.client.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string]vgpu.GPUUsage{}, wantFreed: 1,
		},
		{
			name: "cannot be read",
			change: func(t *testing.T, e *env, pod *corev1.Pod) {
				deleteFromAPI(t, e, pod)
				e.client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, errors.New("connection refused")
				})
			},
			want: slice, tracked: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv, n1 := gpuNode("n1", 1, 16384)
			client := newFakeClient(n1...)
			// The pod watch delivers nothing: the informer sees the pods
			// of its first list only, none here.
			client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
				return true, watch.NewFake(), nil
			})
			e := startEnv(t, testConfig(), client)
			pod := slicePod("p", 4096)
			pod.UID = types.UID("uid-p")
			e.createPod(pod)
			if got := e.bind(pod, "n1"); got.Error != "" {
				t.Fatalf("bind: %s", got.Error)
			}
			if tc.change != nil {
				tc.change(t, e, pod)
			}
			_, ctx := ktesting.NewTestContext(t)

			// Within the grace the informer may still deliver the pod:
			// nothing is read.
			reads := podGets(e)
			e.s.confirmBinds(ctx)
			if got := podGets(e) - reads; got != 0 {
				t.Errorf("within %v of the bind: %d pod reads, want none", confirmGrace, got)
			}
			if diff := cmp.Diff(slice, usageTable(e.s, inv)); diff != "" {
				t.Errorf("usage within the grace (-want +got):\n%s", diff)
			}

			e.clock.SetTime(now.Add(confirmGrace + time.Second))
			e.s.confirmBinds(ctx)
			if diff := cmp.Diff(tc.want, usageTable(e.s, inv)); diff != "" {
				t.Errorf("usage after the grace (-want +got):\n%s", diff)
			}
			if got := tracked(e.s) == 1; got != tc.tracked {
				t.Errorf("still tracked: %t, want %t", got, tc.tracked)
			}
			if got := testutil.ToFloat64(e.s.metrics.staleReleased); got != tc.wantFreed {
				t.Errorf("%s = %v, want %v", MetricStaleReleased, got, tc.wantFreed)
			}
		})
	}
}

// TestConfirmBindsSeenPod checks that a pod the informer has when it is
// bound is never tracked: the informer's own events release it. That holds
// for a pod without GPUs too, which the cache keeps as metadata only and
// Bind reads in full.
func TestConfirmBindsSeenPod(t *testing.T) {
	for _, pod := range []*corev1.Pod{slicePod("p", 4096), vgputest.Pod("cpu").Container("main").Obj()} {
		t.Run(pod.Name, func(t *testing.T) {
			_, n1 := gpuNode("n1", 1, 16384)
			e := newEnv(t, testConfig(), n1...)
			e.createPod(pod)
			waitFor(t, "the informer has the pod", func() bool {
				_, seen := e.s.cachedPod(pod.Namespace, pod.Name, pod.UID)
				return seen
			})
			if got := e.bind(pod, "n1"); got.Error != "" {
				t.Fatalf("bind: %s", got.Error)
			}
			if n := tracked(e.s); n != 0 {
				t.Errorf("%d pods tracked, want none", n)
			}
		})
	}
}

// podGets counts the GETs of pods e's client has served (events and the
// like are written in the background meanwhile).
func podGets(e *env) int {
	n := 0
	for _, a := range e.client.Actions() {
		if a.Matches("get", "pods") {
			n++
		}
	}
	return n
}

// deleteFromAPI deletes pod on e's API server.
func deleteFromAPI(t *testing.T, e *env, pod *corev1.Pod) {
	t.Helper()
	if err := e.client.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// tracked returns how many bound pods s tracks until its informer sees them.
func tracked(s *Scheduler) int {
	s.unconfirmed.mu.Lock()
	defer s.unconfirmed.mu.Unlock()
	return len(s.unconfirmed.pods)
}

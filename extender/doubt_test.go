package extender

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpuslice/gpuslice/vgpu"
)

// TestBindInDoubt posts a Binding that the API server answers with a 500
// without binding the pod, so that the extender cannot tell whether it
// will be committed, and checks that the pod's slice stays reserved (and
// the pod refused) until the doubt is settled as each case says: by the
// informer (the Binding committed late, the pod deleted), or by a read
// once the outcome wait has passed (still unbound: released; bound: kept,
// and tracked until the informer sees it; unreadable: kept). The real API
// server's late commit is TestBindCommittedAfterTimeout in test/extender.
func TestBindInDoubt(t *testing.T) {
	slice := map[string]vgpu.GPUUsage{"n1-GPU-0": {MemoryMiB: 4096, CoresPercent: 10, Slices: 1}}
	none := map[string]vgpu.GPUUsage{}
	tests := []struct {
		name string
		// cutWatch: the pod informer sees nothing after its first list.
		cutWatch    bool
		change      func(t *testing.T, e *env, pod *corev1.Pod, commit func())
		want        map[string]vgpu.GPUUsage // after the wait
		wantDoubt   bool                     // still in doubt after the wait
		wantTracked bool                     // tracked by confirmBinds after the wait
	}{
		{name: "never committed", want: none},
		{name: "committed late", change: func(_ *testing.T, _ *env, _ *corev1.Pod, commit func()) { commit() }, want: slice},
		{name: "committed late, unseen by the informer", cutWatch: true,
			change: func(_ *testing.T, _ *env, _ *corev1.Pod, commit func()) { commit() }, want: slice, wantTracked: true},
		{name: "deleted", change: func(t *testing.T, e *env, pod *corev1.Pod, _ func()) { deleteFromAPI(t, e, pod) }, want: none},
		{name: "unreadable", cutWatch: true, change: func(_ *testing.T, e *env, _ *corev1.Pod, _ func()) {
			e.client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, errors.New("connection refused")
			})
		}, want: slice, wantDoubt: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv, n1 := gpuNode("n1", 1, 16384)
			pod := slicePod("p", 4096)
			pod.UID = types.UID("uid-p")
			client := newFakeClient(objects(n1, []runtime.Object{pod})...)
			var mu sync.Mutex
			var posted *corev1.Binding
			client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				if a.GetSubresource() != "binding" || posted != nil {
					return false, nil, nil
				}
				posted = a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)
				return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
			})
			if tc.cutWatch {
				client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
					return true, watch.NewFake(), nil
				})
			}
			e := startEnv(t, testConfig(), client)
			// commit binds the pod as the posted Binding says, as the API
			// server does when it commits it late.
			commit := func() {
				mu.Lock()
				b := posted
				mu.Unlock()
				bound := e.getPod(pod)
				bound.Spec.NodeName = b.Target.Name
				bound.Annotations = b.Annotations
				if err := client.Tracker().Update(podsResource, bound, bound.Namespace); err != nil {
					t.Fatal(err)
				}
			}

			got := e.bind(pod, "n1")
			if !strings.Contains(got.Error, "etcdserver: request timed out (binding outcome unknown): the pod keeps its GPUs on node n1 until") {
				t.Errorf("bind: Error = %q, want the outcome unknown and the GPUs kept on n1", got.Error)
			}
			if diff := cmp.Diff(slice, usageTable(e.s, inv)); diff != "" {
				t.Errorf("usage while in doubt (-want +got):\n%s", diff)
			}
			if got := e.bind(pod, "n1"); !strings.Contains(got.Error, "an earlier Binding of this pod to node n1 had an unknown outcome") {
				t.Errorf("bind again while in doubt: Error = %q, want a refusal saying why", got.Error)
			}
			if got := testutil.ToFloat64(e.s.metrics.binds.WithLabelValues(BindInDoubt)); got != 2 {
				t.Errorf("%s{result=%q} = %v, want 2", MetricBinds, BindInDoubt, got)
			}
			if tc.change != nil {
				tc.change(t, e, pod, commit)
			}
			if !tc.cutWatch {
				waitFor(t, "the informer settled the reservation", func() bool { return e.s.state.Reservations() == 0 || tc.change == nil })
			}
			_, ctx := ktesting.NewTestContext(t)

			// Within the wait a read cannot settle it: none is made.
			reads := podGets(e)
			e.s.resolveDoubts(ctx)
			if got := podGets(e) - reads; got != 0 {
				t.Errorf("within the outcome wait: %d pod reads, want none", got)
			}

			e.clock.SetTime(now.Add(e.s.cfg.BindOutcomeWait.Duration + time.Second))
			e.s.resolveDoubts(ctx)
			if diff := cmp.Diff(tc.want, usageTable(e.s, inv)); diff != "" {
				t.Errorf("usage after the wait (-want +got):\n%s", diff)
			}
			if got := e.s.bindsInDoubt() == 1; got != tc.wantDoubt {
				t.Errorf("in doubt after the wait: %t, want %t", got, tc.wantDoubt)
			}
			if got := tracked(e.s) == 1; got != tc.wantTracked {
				t.Errorf("tracked by confirmBinds after the wait: %t, want %t", got, tc.wantTracked)
			}
		})
	}
}

package extender

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestNoAnswerBeforeSync checks that a Scheduler whose informers have not
// synced turns every node away as unresolvable and refuses to bind, even
// where its (empty) state would say the GPUs are free: a restarted
// extender must not give a slice twice.
func TestNoAnswerBeforeSync(t *testing.T) {
	inv, n1 := gpuNode("n1", 1, 16384)
	pod := slicePod("p", 4096)
	client := newFakeClient(objects(n1, []runtime.Object{pod})...)
	s, err := New(testConfig(), Options{Client: client, Clock: clocktesting.NewFakePassiveClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	// The state knows the node as the informers would, but has not synced.
	for _, o := range n1 {
		feed(t, s, o)
	}
	_, ctx := ktesting.NewTestContext(t)
	res, err := s.Filter(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{inv.Node}})
	if err != nil {
		t.Fatal(err)
	}
	want := &extenderv1.ExtenderFilterResult{
		NodeNames:                  &[]string{},
		FailedNodes:                extenderv1.FailedNodesMap{},
		FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{"n1": "gpuslice-scheduler not ready: informer caches not synced"},
	}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("Filter before sync (-want +got):\n%s", diff)
	}
	scores, err := s.Prioritize(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{inv.Node}})
	if err != nil || scores[0].Score != 0 {
		t.Errorf("Prioritize before sync = %v, %v; want score 0", scores, err)
	}
	got, err := s.Bind(ctx, &extenderv1.ExtenderBindingArgs{PodName: "p", PodNamespace: "default", PodUID: pod.UID, Node: "n1"})
	if err != nil || !strings.Contains(got.Error, "informer caches not synced") {
		t.Errorf("Bind before sync = %+v, %v; want a not-synced error", got, err)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() != "list" && a.GetVerb() != "watch" {
			t.Errorf("request before sync: %s %s/%s", a.GetVerb(), a.GetResource().Resource, a.GetSubresource())
		}
	}
	if n := s.Rejections()[ReasonNotSynced]; n != 1 {
		t.Errorf("rejections %s = %d, want 1", ReasonNotSynced, n)
	}
}

// feed hands obj to the state as an informer event would.
func feed(t *testing.T, s *Scheduler, obj runtime.Object) {
	t.Helper()
	switch o := obj.(type) {
	case *corev1.Node:
		s.state.UpsertNode(o)
	case *coordinationv1.Lease:
		s.state.UpsertLease(o)
	default:
		t.Fatalf("feed: %T", obj)
	}
}

// TestBindOverload checks that binds beyond MaxPendingBinds are refused at
// once, without a request, while the admitted ones wait for the API
// server, and that a refused pod binds once there is room again.
func TestBindOverload(t *testing.T) {
	_, n1 := gpuNode("n1", 2, 16384)
	pods := []runtime.Object{slicePod("p0", 1024), slicePod("p1", 1024)}
	client := newFakeClient(objects(n1, pods)...)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "binding" {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
		return false, nil, nil
	})
	cfg := testConfig()
	cfg.MaxPendingBinds = 1
	e := startEnv(t, cfg, client)
	waitFor(t, "pods in the informer", func() bool {
		store := e.s.pods.Load()
		return store != nil && len((*store).List()) == 2
	})
	first := make(chan extenderv1.ExtenderBindingResult, 1)
	go func() {
		var out extenderv1.ExtenderBindingResult
		args := extenderv1.ExtenderBindingArgs{PodName: "p0", PodNamespace: "default", PodUID: "uid-p0", Node: "n1"}
		if code, body := e.post("/bind", args, &out); code != http.StatusOK {
			out.Error = fmt.Sprintf("HTTP %d: %s", code, body)
		}
		first <- out
	}()
	<-entered
	if got := e.bind(slicePod("p1", 1024), "n1"); !strings.Contains(got.Error, "extender overloaded: 1 binds are already waiting") {
		t.Errorf("second bind while one waits: Error = %q, want overloaded", got.Error)
	}
	close(release)
	if got := <-first; got.Error != "" {
		t.Errorf("first bind: %s", got.Error)
	}
	if got := e.bind(slicePod("p1", 1024), "n1"); got.Error != "" {
		t.Errorf("second bind after the first: %s", got.Error)
	}
	if got := e.getPod(slicePod("p1", 1024)); got.Spec.NodeName != "n1" || got.Annotations[vgpu.AnnotationPodAllocation] == "" {
		t.Errorf("p1: node %q, allocation %q", got.Spec.NodeName, got.Annotations[vgpu.AnnotationPodAllocation])
	}
	if reads := testutil.ToFloat64(e.s.metrics.bindPodReads); reads != 0 {
		t.Errorf("%s = %v, want 0: pods come from the informer", MetricBindPodReads, reads)
	}
}

// TestUnlabelledLeaseIgnored checks that the extender reads only Leases
// that carry vgpu.LabelHeartbeat: a heartbeat Lease without it is not
// watched, and its node is "plugin not ready".
func TestUnlabelledLeaseIgnored(t *testing.T) {
	inv := vgputest.Node("n1").GPU("n1-GPU-0", 16384).Obj()
	lease := vgputest.HeartbeatLease("n1", now).Obj()
	lease.Labels = nil
	e := newEnv(t, testConfig(), vgputest.PublishedNode(inv).Obj(), lease)
	got := e.filter(slicePod("p", 1024), "n1")
	if msg := got.FailedAndUnresolvableNodes["n1"]; msg != "plugin not ready: no heartbeat Lease in namespace kube-node-lease" {
		t.Errorf("n1: %q, want no heartbeat Lease", msg)
	}
}

// TestOutcomeUnknown checks which failed Binding requests may still have
// bound the pod.
func TestOutcomeUnknown(t *testing.T) {
	gr := podsResource.GroupResource()
	tests := []struct {
		err  error
		want bool
	}{
		{apierrors.NewConflict(gr, "p", context.Canceled), false},
		{apierrors.NewNotFound(gr, "p"), false},
		{apierrors.NewForbidden(gr, "p", context.Canceled), false},
		{apierrors.NewTooManyRequests("slow down", 1), false},
		{apierrors.NewTimeoutError("reply lost", 1), true},
		{apierrors.NewInternalError(context.Canceled), true},
		{context.DeadlineExceeded, true},
		{&url.Error{Op: "Post", URL: "https://apiserver/binding", Err: &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}}, true},
		{&url.Error{Op: "Post", URL: "https://apiserver/binding", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}, false},
	}
	for _, tt := range tests {
		if got := outcomeUnknown(tt.err); got != tt.want {
			t.Errorf("outcomeUnknown(%v) = %t, want %t", tt.err, got, tt.want)
		}
	}
}

package extender

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuslice/gpuslice/internal/metricstest"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// schedulerLease is kube-scheduler's leader Lease held by holder, renewed at renewed for 15 s.
func schedulerLease(holder string, renewed time.Time) *coordinationv1.Lease {
	seconds := int32(15)
	t := metav1.NewMicroTime(renewed)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "gpuslice-system", Name: "gpuslice-scheduler"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &t},
	}
}

func TestLeadsUntil(t *testing.T) {
	ours := schedulerLease("sched-a_0c5e", now)
	without := func(mutate func(l *coordinationv1.Lease)) *coordinationv1.Lease {
		l := ours.DeepCopy()
		mutate(l)
		return l
	}
	tests := []struct {
		name  string
		lease *coordinationv1.Lease
		want  time.Time
	}{
		{name: "held by the kube-scheduler beside it", lease: ours, want: now.Add(15 * time.Second)},
		{name: "no Lease", lease: nil},
		{name: "held by another host", lease: schedulerLease("sched-b_77aa", now)},
		{name: "another host whose name starts with ours", lease: schedulerLease("sched-ab_77aa", now)},
		{name: "our host name without the UUID", lease: schedulerLease("sched-a", now)},
		{name: "released", lease: without(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = new(string) })},
		{name: "no holder", lease: without(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil })},
		{name: "no renewTime", lease: without(func(l *coordinationv1.Lease) { l.Spec.RenewTime = nil })},
		{name: "no duration", lease: without(func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = nil })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := leadsUntil(tt.lease, "sched-a"); !got.Equal(tt.want) {
				t.Errorf("leadsUntil = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestLeaderFollowsKubeScheduler runs a Scheduler with informers over a fake API whose node
// "stale" has a heartbeat two minutes old under a True registration condition, and moves
// kube-scheduler's leader Lease: while another kube-scheduler holds it the extender leads not and
// writes no condition; once the Lease names the kube-scheduler beside it (same host name) it
// leads and turns the condition Unknown; when the Lease expires by the clock it stops; renewed,
// a new term judges the nodes again (a second stale node turns Unknown); a holder whose host name
// merely starts with its own does not make it lead.
func TestLeaderFollowsKubeScheduler(t *testing.T) {
	inv, _ := gpuNode("stale", 1, 16384)
	inv2, _ := gpuNode("stale-2", 1, 16384)
	client := fake.NewClientset(
		vgputest.PublishedNode(*inv).Condition(vgpu.ConditionRegistered, corev1.ConditionTrue, vgpu.ReasonRegistered).Obj(),
		vgputest.HeartbeatLease("stale", now.Add(-2*DefaultHeartbeatMaxAge)).Obj(),
		schedulerLease("sched-b_77aa", now),
	)
	clk := clocktesting.NewFakeClock(now)
	cfg := testConfig()
	cfg.LeaderLease = "gpuslice-system/gpuslice-scheduler"
	s, err := New(cfg, Options{Client: client, Clock: clk, Hostname: "sched-a"})
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.WatchCluster(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchCluster: %v", err)
		}
	})
	waitFor(t, "informers synced", s.Ready)
	leases := client.CoordinationV1().Leases("gpuslice-system")
	waitFor(t, "the extender watching kube-scheduler's Lease", func() bool {
		for _, a := range client.Actions() {
			if a.GetVerb() == "watch" && a.GetResource().Resource == "leases" && a.GetNamespace() == "gpuslice-system" {
				return true
			}
		}
		return false
	})
	condition := func(node string) string {
		n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c, _ := vgpu.RegisteredCondition(n)
		return string(c.Status) + "/" + c.Reason
	}
	statusPatches := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "patch" && a.GetSubresource() == "status" {
				n++
			}
		}
		return n
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	leader := func() float64 { return metricstest.Scrape(t, nil, srv.URL+"/metrics")[MetricLeader] }

	// Another kube-scheduler leads.
	if s.Leading() || statusPatches() != 0 || leader() != 0 {
		t.Fatalf("follower: Leading %v, %d status patches, %s %v; want false, 0, 0", s.Leading(), statusPatches(), MetricLeader, leader())
	}

	// The kube-scheduler beside it takes over.
	if _, err := leases.Update(ctx, schedulerLease("sched-a_0c5e", clk.Now()), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "leading", s.Leading)
	waitFor(t, "stale turned Unknown by the leader", func() bool { return condition("stale") == "Unknown/HeartbeatStale" })
	if got := leader(); got != 1 {
		t.Errorf("%s = %v while leading, want 1", MetricLeader, got)
	}

	// Its Lease runs out: the kube-scheduler beside it stopped renewing.
	clk.Step(16 * time.Second)
	waitFor(t, "no longer leading once the Lease expired", func() bool { return !s.Leading() })
	if got := leader(); got != 0 {
		t.Errorf("%s = %v after the Lease expired, want 0", MetricLeader, got)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, vgputest.PublishedNode(*inv2).Condition(vgpu.ConditionRegistered, corev1.ConditionTrue, vgpu.ReasonRegistered).Obj(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stale-2 in the cache", func() bool { return len(s.state.Registrations()) == 2 })
	patches := statusPatches()

	// Renewed again: a new term passes over the nodes at once.
	if _, err := leases.Update(ctx, schedulerLease("sched-a_91f0", clk.Now()), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stale-2 turned Unknown in the new term", func() bool { return condition("stale-2") == "Unknown/HeartbeatStale" })
	if got := statusPatches() - patches; got != 1 {
		t.Errorf("%d status patches in the new term, want 1 (stale-2; stale is Unknown already)", got)
	}

	// A host whose name starts with this one's.
	if _, err := leases.Update(ctx, schedulerLease("sched-ab_1d2e", clk.Now()), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "no longer leading under another host's kube-scheduler", func() bool { return !s.Leading() })
	if diff := cmp.Diff(map[string]string{"stale": "Unknown/HeartbeatStale", "stale-2": "Unknown/HeartbeatStale"},
		map[string]string{"stale": condition("stale"), "stale-2": condition("stale-2")}); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
}

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/gpuslice/gpuslice/extender"
	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// The hand-over scenario's cluster: two nodes of two GPUs split eight ways, 32 slices in all; its
// pods take a slice each.
const (
	handOverBurst     = 32
	handOverSliceMiB  = 8192
	handOverHeartbeat = 3 * time.Second
)

// handOverElection is kube-scheduler's leader election in the scenario: shorter than its
// defaults, so that a hand-over takes seconds.
var handOverElection = cluster.LeaderElection{LeaseDuration: 8 * time.Second, RenewDeadline: 6 * time.Second, RetryPeriod: time.Second}

// TestSchedulerHandOver runs two scheduler pairs, as the chart's two scheduler replicas: each a
// kube-scheduler with leader election on one Lease and the extender beside it, in a host name of
// their own and each process with its own API user, so that the API server's audit log tells who
// wrote what. Pair 0 leads at the start.
//
//  1. A burst of 32 GPU pods, the cluster's 32 slices, is created and the leading pair is killed
//     (SIGKILL, both processes) once a few are bound. Pair 1 takes over: every pod is bound
//     exactly once and Running, no GPU holds more than it has, every container got its own pod's
//     slice; the hand-over time (leader killed to the first bind by the new leader) is logged.
//     Pair 0 comes back, as a Deployment's new pod would, and follows.
//  2. Only pair 1's kube-scheduler is killed while its extender stays, remembering two pods it
//     turned away (no free slice on node-1, node-2's plugin frozen). Pair 0 takes over; once its
//     extender turned the pods away too, node-2's plugin comes back: a heartbeat Lease is no event
//     for kube-scheduler, so only an extender's retry annotation gets the pods placed. Then
//     node-1's plugin freezes, and its condition must turn Unknown.
//
// The audit log then must show every bind, retry annotation, node condition and node event of an
// extender made while its own kube-scheduler held the Lease (read from the same log), and the new
// leader's extender writing retries and conditions. Real: every Kubernetes component and
// gpuslice's binaries. Fake: NVML and the container runtime.
func TestSchedulerHandOver(t *testing.T) {
	pluginArgs := []string{"--split-count=8", "--lease-renew=1s"}
	opts := clusterOptions(
		cluster.NodeOptions{Name: "node-1", FakeGPUs: "2xA100-80GB", PluginArgs: pluginArgs},
		cluster.NodeOptions{Name: "node-2", FakeGPUs: "2xA100-80GB", PluginArgs: pluginArgs},
	)
	opts.Schedulers, opts.LeaderElection, opts.Audit = 2, handOverElection, true
	opts.ExtenderArgs = []string{"--heartbeat-max-age=" + handOverHeartbeat.String()}
	c := startClusterWith(t, opts)
	pairs := c.Schedulers()
	a, b := pairs[0], pairs[1]
	node1, node2 := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)

	// 1. The burst, and the leader pair killed mid-burst.
	created := make(chan error, 1)
	go func() {
		for i := range handOverBurst {
			if _, err := pods.Create(ctx, slicePod(fmt.Sprintf("burst-%02d", i), handOverSliceMiB, 0), metav1.CreateOptions{}); err != nil {
				created <- err
				return
			}
		}
		created <- nil
	}()
	poll(t, time.Minute, "the first burst pods bound by pair 0", func(ctx context.Context) (bool, string) {
		n := countBound(ctx, c, "burst-")
		return n >= 4, fmt.Sprintf("%d bound", n)
	})
	killed := time.Now()
	for _, name := range []string{a.KubeScheduler, a.Extender} {
		if err := c.End(name, true); err != nil {
			t.Fatal(err)
		}
	}
	boundAtKill := countBound(ctx, c, "burst-")
	if boundAtKill >= handOverBurst {
		t.Fatalf("all %d pods were bound before the leader was killed: no hand-over mid-burst", boundAtKill)
	}
	if err := <-created; err != nil {
		t.Fatalf("create the burst: %v", err)
	}
	running := waitAllRunning(t, c, "burst-", handOverBurst, 3*time.Minute)
	if leader, err := c.SchedulerLeader(ctx); err != nil || leader != 1 {
		t.Fatalf("leader after the hand-over: pair %d (%v), want 1", leader, err)
	}
	checkSlices(t, c, running)
	events, err := c.AuditWrites()
	if err != nil {
		t.Fatal(err)
	}
	checkBoundOnce(t, events, running)
	logHandOver(t, events, killed, b, boundAtKill)
	// The killed pair comes back, as the Deployment's new pod would; it follows.
	for _, name := range []string{a.Extender, a.KubeScheduler} {
		if err := c.StartAgain(ctx, name); err != nil {
			t.Fatal(err)
		}
	}

	// 2. Pair 1's kube-scheduler dies alone; its extender remembers two pods it turned away.
	var freed int
	for _, p := range running {
		if p.Spec.NodeName == node2.Name && freed < 2 {
			deleteAndWait(t, c, p.Name)
			freed++
		}
	}
	if err := node2.PausePlugin(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node2.ResumePlugin)
	waitRegistered(t, c, node2.Name, corev1.ConditionUnknown, vgpu.ReasonHeartbeatStale)
	for _, name := range []string{"waiter-0", "waiter-1"} {
		if _, err := pods.Create(ctx, slicePod(name, handOverSliceMiB, 0), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPendingWith(t, c, name, "plugin not ready")
	}
	if err := c.End(b.KubeScheduler, true); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "pair 0 leading again", func(ctx context.Context) (bool, string) {
		leader, err := c.SchedulerLeader(ctx)
		return leader == 0, fmt.Sprintf("pair %d (%v)", leader, err)
	})
	if err := c.StartAgain(ctx, b.KubeScheduler); err != nil {
		t.Fatal(err)
	}
	filtered := fmt.Sprintf(`%s{code="200",verb="filter"}`, extender.MetricRequests)
	poll(t, time.Minute, "pair 0's extender asked about the waiting pods", func(context.Context) (bool, string) {
		got, err := scrapeGauges(a.ExtenderURL()+"/metrics", []string{filtered})
		return err == nil && got[filtered] >= 2, fmt.Sprintf("%v (%v)", got, err)
	})
	node2.ResumePlugin()
	for _, name := range []string{"waiter-0", "waiter-1"} {
		p := waitRunningOn(t, c, name, node2.Name)
		if p.Annotations[extender.AnnotationRetry] == "" {
			t.Errorf("%s Running without %s: kube-scheduler retried it on some other event", name, extender.AnnotationRetry)
		}
	}
	if err := node1.PausePlugin(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node1.ResumePlugin)
	waitRegistered(t, c, node1.Name, corev1.ConditionUnknown, vgpu.ReasonHeartbeatStale)
	node1.ResumePlugin()

	// Only the leader wrote.
	if events, err = c.AuditWrites(); err != nil {
		t.Fatal(err)
	}
	terms := leaderTerms(events, pairs)
	writes := pairWrites(events, pairs, []string{node1.Name, node2.Name})
	t.Logf("leader terms: %v", terms)
	if bad := outsideTerms(writes, terms); len(bad) > 0 {
		t.Errorf("%d writes by an extender whose kube-scheduler did not lead:\n%v", len(bad), bad)
	}
	last := terms[len(terms)-1]
	if last.pair != 0 {
		t.Fatalf("last leader term %v, want pair 0's", last)
	}
	done := map[string]bool{}
	for _, w := range writes {
		if w.pair == 0 && last.contains(w.at) {
			done[w.kind] = true
		}
	}
	for _, kind := range []string{writeRetry, writeCondition, writeNodeEvent} {
		if !done[kind] {
			t.Errorf("pair 0's extender made no %s write after it took over again (%v): the scenario did not exercise it", kind, last)
		}
	}
}

// countBound returns how many pods whose name starts with prefix are bound.
func countBound(ctx context.Context, c *cluster.Cluster, prefix string) int {
	list, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0
	}
	n := 0
	for _, p := range list.Items {
		if strings.HasPrefix(p.Name, prefix) && p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}

// waitAllRunning waits until want pods whose name starts with prefix exist and all are Running,
// and returns them sorted by name.
func waitAllRunning(t *testing.T, c *cluster.Cluster, prefix string, want int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var got []corev1.Pod
	poll(t, timeout, fmt.Sprintf("%d %s pods Running", want, prefix), func(ctx context.Context) (bool, string) {
		list, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		got = got[:0]
		phases := map[corev1.PodPhase]int{}
		for _, p := range list.Items {
			if strings.HasPrefix(p.Name, prefix) {
				got = append(got, p)
				phases[p.Status.Phase]++
			}
		}
		return len(got) == want && phases[corev1.PodRunning] == want, fmt.Sprintf("%d pods: %v", len(got), phases)
	})
	slices.SortFunc(got, func(x, y corev1.Pod) int { return strings.Compare(x.Name, y.Name) })
	return got
}

// checkSlices fails t when a GPU holds more than it has or a container did not get its own pod's
// slice.
func checkSlices(t *testing.T, c *cluster.Cluster, running []corev1.Pod) {
	t.Helper()
	over, err := c.CapacityViolations(context.Background(), running)
	if err != nil {
		t.Fatal(err)
	}
	if len(over) > 0 {
		t.Errorf("GPUs over-committed:\n%s", strings.Join(over, "\n"))
	}
	if bad := checkExact(t, c, running); len(bad) > 0 {
		t.Errorf("containers without their own pod's slice:\n%s", strings.Join(bad, "\n"))
	}
}

// checkBoundOnce fails t unless each pod was bound once by the audit log: at most one successful
// Binding, and one at all unless a Binding's outcome is in doubt. A Binding in flight when its
// extender is killed is such a one: the API server may commit it after the client has gone and
// log it as failed (5xx, "Handler timeout", or no response at all); a second Binding of the same
// pod would have been refused (409), so the pod is still bound once. The pods are all Running on
// their nodes by the time this is called.
func checkBoundOnce(t *testing.T, events []auditv1.Event, pods []corev1.Pod) {
	t.Helper()
	binds, inDoubt := map[string]int{}, map[string]int{}
	for _, e := range events {
		ref := e.ObjectRef
		if ref == nil || ref.Resource != "pods" || ref.Subresource != "binding" || e.Verb != "create" {
			continue
		}
		switch {
		case e.ResponseStatus != nil && e.ResponseStatus.Code < 300:
			binds[ref.Name]++
		case e.ResponseStatus == nil || e.ResponseStatus.Code >= 500:
			inDoubt[ref.Name]++
		}
	}
	for _, p := range pods {
		switch n, d := binds[p.Name], inDoubt[p.Name]; {
		case n > 1:
			t.Errorf("%s: %d successful Bindings, want 1", p.Name, n)
		case n == 0 && d == 0:
			t.Errorf("%s: no Binding in the audit log, want 1", p.Name)
		case n == 0:
			t.Logf("%s: bound by a Binding whose outcome the API server logged as failed (%d in doubt): committed after its client went", p.Name, d)
		}
	}
}

// logHandOver logs how long the hand-over took: from the leader's kill to the new leader's first
// write of the Lease and to its extender's first successful bind.
func logHandOver(t *testing.T, events []auditv1.Event, killed time.Time, to cluster.SchedulerPair, boundAtKill int) {
	t.Helper()
	var lease, bind time.Time
	for _, e := range byReceipt(events) {
		ref, at := e.ObjectRef, received(e)
		if ref == nil || at.Before(killed) || e.ResponseStatus == nil || e.ResponseStatus.Code >= 300 {
			continue
		}
		if lease.IsZero() && e.User.Username == to.KubeSchedulerUser && ref.Resource == "leases" && ref.Name == cluster.LeaderLeaseName {
			lease = at
		}
		if bind.IsZero() && e.User.Username == to.ExtenderUser && ref.Resource == "pods" && ref.Subresource == "binding" {
			bind = at
		}
	}
	if bind.IsZero() {
		t.Fatalf("no bind by %s after the leader was killed", to.Extender)
	}
	t.Logf("hand-over: leader killed with %d of %d pods bound; %s took the Lease %v later and its extender bound its first pod %v after the kill (lease %v)",
		boundAtKill, handOverBurst, to.KubeScheduler, lease.Sub(killed).Round(time.Millisecond), bind.Sub(killed).Round(time.Millisecond), handOverElection.LeaseDuration)
}

// deleteAndWait deletes the pod name at once and waits until it is gone.
func deleteAndWait(t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	if err := pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, name+" gone", func(ctx context.Context) (bool, string) {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// waitRegistered waits until node's registration condition has status and reason.
func waitRegistered(t *testing.T, c *cluster.Cluster, node string, status corev1.ConditionStatus, reason string) {
	t.Helper()
	poll(t, time.Minute, node+" condition "+string(status)+"/"+reason, func(ctx context.Context) (bool, string) {
		n, err := c.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		cond, _ := vgpu.RegisteredCondition(n)
		return cond.Status == status && cond.Reason == reason, fmt.Sprintf("%s/%s %q", cond.Status, cond.Reason, cond.Message)
	})
}

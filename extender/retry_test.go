package extender

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpuslice/gpuslice/internal/metricstest"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestRetriesOrder checks which pods are due: those turned away by a Filter
// that read the state before the latest change, not those turned away
// after it, and a Filter that raced a change wakes the loop.
func TestRetriesOrder(t *testing.T) {
	r := newRetries()
	before, after, racing := slicePod("before", 1024), slicePod("after", 1024), slicePod("racing", 1024)
	r.rejected(before, demand{}, r.seen(), onNode(0, classNotReady))
	woken := func() bool {
		select {
		case <-r.wake:
			return true
		default:
			return false
		}
	}
	if woken() {
		t.Fatal("woken with no change")
	}
	racingSeen := r.seen() // a Filter starts, then the change lands
	changedAt := now.Add(time.Second)
	r.changed(changedAt, 0, changeReady)
	if !woken() {
		t.Fatal("a change with a pod waiting did not wake the loop")
	}
	r.rejected(after, demand{}, r.seen(), onNode(0, classNotReady))
	if woken() {
		t.Fatal("a rejection after the change woke the loop")
	}
	r.rejected(racing, demand{}, racingSeen, onNode(0, classNotReady))
	if !woken() {
		t.Fatal("a rejection by a Filter that started before the change did not wake the loop")
	}
	at, pods, again := r.due(now, allFit)
	if !at.Equal(changedAt) || again != 0 {
		t.Errorf("due at %v, again in %v; want %v and no other pass", at, again, changedAt)
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"before", "racing"}) {
		t.Errorf("due pods %v, want before and racing", names)
	}
	if _, pods, _ := r.due(now, allFit); len(pods) != 0 {
		t.Errorf("pods due twice: %v", pods)
	}
	for _, p := range []*corev1.Pod{before, after, racing} {
		r.forget(p.UID)
	}
	r.changed(changedAt.Add(time.Second), 0, changeReady)
	if woken() {
		t.Error("a change with no pod waiting woke the loop")
	}
}

// TestRetriesRacedElsewhere checks that a Filter which raced a change is
// judged against the changes recorded since it read the state: a change on
// a node that did not turn the pod away does not wake it (a freed GPU on
// another node while kube-scheduler re-filters the pod), one on the node
// that did does; and when the changes since are no longer recorded by
// node, the pod is due whatever they were.
func TestRetriesRacedElsewhere(t *testing.T) {
	r := newRetries()
	r.rejected(slicePod("waiter", 1024), demand{}, r.seen(), onNode(0, classCapacity))
	seen := r.seen() // a Filter of the racing pod starts
	r.changed(now, 1, changeFreed)
	racing := slicePod("racing", 1024)
	r.rejected(racing, demand{}, seen, onNode(0, classCapacity))
	if _, pods, _ := r.due(now, allFit); len(pods) != 0 {
		t.Errorf("due after a change on another node: %v", pods)
	}
	seen = r.seen()
	r.changed(now, 0, changeFreed)
	r.rejected(racing, demand{}, seen, onNode(0, classCapacity))
	_, pods, _ := r.due(now, allFit)
	if names := podNames(pods); !slices.Equal(names, []string{"racing", "waiter"}) {
		t.Errorf("due after a change on their node: %v, want racing and waiter", names)
	}
	// Nobody waits: the next change is counted but not recorded by node.
	r.forget("uid-waiter")
	r.forget(racing.UID)
	seen = r.seen()
	r.changed(now, 1, changeFreed)
	r.rejected(racing, demand{}, seen, onNode(0, classCapacity))
	if _, pods, _ := r.due(now.Add(retryInterval), allFit); len(pods) != 1 {
		t.Errorf("a Filter that raced an unrecorded change: due %v, want it", pods)
	}
}

func podNames(pods []waitingPod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.name)
	}
	slices.Sort(names)
	return names
}

// TestRetriesPacing checks the limits on writes: at most retryBatch pods
// per pass, the most recently turned away first, and one pod at most once
// per retryInterval however many changes come.
func TestRetriesPacing(t *testing.T) {
	r := newRetries()
	var pods []*corev1.Pod
	for i := range retryBatch + 5 {
		p := slicePod(fmt.Sprintf("p%02d", i), 1024)
		pods = append(pods, p)
		r.rejected(p, demand{}, r.seen(), onNode(0, classNotReady))
		r.changed(now, 0, changeReady) // each pod is turned away one change later than the one before
	}
	_, first, again := r.due(now, allFit)
	if len(first) != retryBatch || again <= 0 || again > retryDelay {
		t.Fatalf("first pass: %d pods, again in %v; want %d and another pass soon", len(first), again, retryBatch)
	}
	for _, p := range first {
		if p.name < "p05" {
			t.Errorf("%s asked in the first pass before a pod turned away later", p.name)
		}
	}
	_, second, again := r.due(now, allFit)
	if len(second) != 5 || again != 0 {
		t.Fatalf("second pass: %d pods, again in %v; want the 5 left and no other pass", len(second), again)
	}

	// Every pod is turned away again, and another change comes 10 s later:
	// all were asked within retryInterval, so none is due until it ends.
	for _, p := range pods {
		r.rejected(p, demand{}, r.seen(), onNode(0, classNotReady))
	}
	r.changed(now.Add(10*time.Second), 0, changeReady)
	_, none, again := r.due(now.Add(10*time.Second), allFit)
	if len(none) != 0 || again != retryInterval-10*time.Second {
		t.Fatalf("within retryInterval: %d pods, again in %v; want none and a pass in %v", len(none), again, retryInterval-10*time.Second)
	}
	_, third, _ := r.due(now.Add(retryInterval), allFit)
	if len(third) != retryBatch {
		t.Errorf("after retryInterval: %d pods, want %d", len(third), retryBatch)
	}
}

// TestRetryAfterChange runs the informers and the retry loop on a fake
// clientset: a pod turned away while a node's plugin was not ready, while
// memory was short, or while the heartbeat was stale gets the retry
// annotation once the change reaches the extender; a pod turned away after
// the change does not.
func TestRetryAfterChange(t *testing.T) {
	_, n1 := gpuNode("n1", 1, 16384)
	node := n1[0].(*corev1.Node).DeepCopy()
	node.Labels[vgpu.LabelGPUReady] = "false"
	running := boundPod(vgputest.Pod("running").Container("main").GPU(1).MemoryMiB(12288).Cores(10),
		vgputest.Allocation("n1").Container("main").Slice("n1-GPU-0", 12288, 10).Obj())
	e := newEnv(t, testConfig(), node, n1[1], running)
	ctx := context.Background()
	retried := func(pod *corev1.Pod) bool { return e.getPod(pod).Annotations[AnnotationRetry] != "" }

	waiter := slicePod("waiter", 1024)
	e.createPod(waiter)
	if v := e.filter(waiter, "n1"); len(*v.NodeNames) != 0 {
		t.Fatalf("waiter passed n1 while its label is false: %+v", v)
	}
	node.Labels[vgpu.LabelGPUReady] = "true"
	if _, err := e.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiter asked to retry after n1 turned ready", func() bool { return retried(waiter) })
	if v := e.getPod(waiter).Annotations[AnnotationRetry]; v == "" {
		t.Fatal("no retry annotation")
	} else if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
		t.Errorf("retry annotation %q: %v", v, err)
	}
	// kube-scheduler's retry: the waiter passes now.
	if v := e.filter(waiter, "n1"); len(*v.NodeNames) != 1 {
		t.Fatalf("waiter does not pass n1 once ready: %+v", v)
	}

	// late is turned away for memory after every change so far: it waits
	// until running is deleted.
	late := slicePod("late", 8192)
	e.createPod(late)
	if v := e.filter(late, "n1"); len(*v.NodeNames) != 0 {
		t.Fatalf("late passed n1 with 4096 MiB free: %+v", v)
	}
	if _, pods, _ := e.s.dueRetries(); len(pods) != 0 {
		t.Errorf("due before running was deleted: %+v", pods)
	}
	if err := e.client.CoreV1().Pods(running.Namespace).Delete(ctx, running.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "late asked to retry after running was deleted", func() bool { return retried(late) })
	if v := e.filter(late, "n1"); len(*v.NodeNames) != 1 {
		t.Fatalf("late does not pass n1 once running is gone: %+v", v)
	}

	// Stale heartbeat: a pod turned away for it is asked to retry once the
	// Lease is renewed, which kube-scheduler never sees.
	e.clock.SetTime(now.Add(3 * time.Minute))
	stale := slicePod("stale", 1024)
	e.createPod(stale)
	if got := e.filter(stale, "n1").FailedAndUnresolvableNodes["n1"]; got == "" {
		t.Fatal("stale passed n1 with a heartbeat three minutes old")
	}
	lease := vgputest.HeartbeatLease("n1", now.Add(3*time.Minute)).Obj()
	if _, err := e.client.CoordinationV1().Leases(lease.Namespace).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stale asked to retry after the Lease was renewed", func() bool { return retried(stale) })

	// A pod turned away after the last change stays as it is.
	after := slicePod("after", 1024)
	e.createPod(after)
	e.filter(after, "missing-node")
	if _, pods, _ := e.s.dueRetries(); len(pods) != 0 {
		t.Errorf("due after the last change: %+v", pods)
	}
	if got := metricstest.Scrape(t, nil, e.srv.URL+"/metrics")[MetricRetries]; got != 3 {
		t.Errorf("%s = %v, want 3 (waiter, late, stale)", MetricRetries, got)
	}
}

// TestRetriesFailed checks that a pod whose retry request failed is due
// again in the next pass, not only after retryInterval and a new change.
func TestRetriesFailed(t *testing.T) {
	r := newRetries()
	p := slicePod("p", 1024)
	r.rejected(p, demand{}, r.seen(), onNode(0, classNotReady))
	r.changed(now, 0, changeReady)
	_, pods, _ := r.due(now, allFit)
	if len(pods) != 1 {
		t.Fatalf("due: %d pods, want 1", len(pods))
	}
	<-r.wake // the change's signal
	r.failed(pods[0])
	select {
	case <-r.wake:
	default:
		t.Error("a failed request did not wake the loop")
	}
	if _, again, _ := r.due(now.Add(retryDelay), allFit); len(again) != 1 {
		t.Errorf("after a failed request: %d pods due, want 1", len(again))
	}
	// A request that failed after the pod was forgotten brings nothing back.
	r.forget(p.UID)
	r.failed(pods[0])
	if _, none, _ := r.due(now.Add(2*retryDelay), allFit); len(none) != 0 {
		t.Errorf("forgotten pod due again: %+v", none)
	}
}

// onNode is a rejection by the node with index node for a reason of class.
func onNode(node int, class rejectClass) rejection {
	var rej rejection
	rej.nodes[class].add(node)
	return rej
}

// allFit is a due fits that says every pod fits every node.
func allFit(*waitingPod, int) bool { return true }

// TestRetriesTargeted checks that a change wakes only the pods a node
// turned away for a reason of a class the change may cure, and only when
// the pod fits that node now.
func TestRetriesTargeted(t *testing.T) {
	r := newRetries()
	memory := slicePod("memory", 8192)      // node 0: insufficient memory
	notReady := slicePod("not-ready", 1024) // node 1: plugin not ready
	model := slicePod("model", 1024)        // node 0: wrong model
	r.rejected(memory, demand{}, r.seen(), onNode(0, classCapacity))
	r.rejected(notReady, demand{}, r.seen(), onNode(1, classNotReady))
	r.rejected(model, demand{}, r.seen(), onNode(0, classInventory))
	names := func(pods []waitingPod) []string {
		var out []string
		for _, p := range pods {
			out = append(out, p.name)
		}
		slices.Sort(out)
		return out
	}
	var asked [][2]string
	fitsIf := func(ok bool) func(w *waitingPod, node int) bool {
		return func(w *waitingPod, node int) bool {
			asked = append(asked, [2]string{w.name, fmt.Sprint(node)})
			return ok
		}
	}
	steps := []struct {
		name   string
		node   int
		kind   changeKind
		fits   bool
		want   []string
		judged [][2]string
	}{
		{name: "freed on node 1 cures nothing there", node: 1, kind: changeFreed, fits: true},
		{name: "freed on node 0, memory still short", node: 0, kind: changeFreed, fits: false, judged: [][2]string{{"memory", "0"}}},
		{name: "freed on node 0, memory fits", node: 0, kind: changeFreed, fits: true, want: []string{"memory"}, judged: [][2]string{{"memory", "0"}}},
		{name: "node 1 ready", node: 1, kind: changeReady, fits: true, want: []string{"not-ready"}, judged: [][2]string{{"not-ready", "1"}}},
		// An inventory change may cure capacity too.
		{name: "inventory of node 0", node: 0, kind: changeInventory, fits: true, want: []string{"memory", "model"}, judged: [][2]string{{"memory", "0"}, {"model", "0"}}},
	}
	for i, st := range steps {
		asked = nil
		r.changed(now, st.node, st.kind)
		_, pods, _ := r.due(now.Add(time.Duration(i)*retryInterval), fitsIf(st.fits))
		if diff := cmp.Diff(st.want, names(pods)); diff != "" {
			t.Errorf("%s: woken (-want +got):\n%s", st.name, diff)
		}
		slices.SortFunc(asked, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
		if diff := cmp.Diff(st.judged, asked); diff != "" {
			t.Errorf("%s: fits asked (-want +got):\n%s", st.name, diff)
		}
	}
	// A pod turned away before the caches synced is woken by the sync.
	for _, p := range []*corev1.Pod{memory, notReady, model} {
		r.forget(p.UID)
	}
	unsynced := slicePod("unsynced", 1024)
	r.rejected(unsynced, demand{}, r.seen(), rejection{unjudge: true})
	r.changedEverywhere(now)
	if _, pods, _ := r.due(now.Add(10*retryInterval), fitsIf(false)); !slices.Equal(names(pods), []string{"unsynced"}) {
		t.Errorf("after the sync: woken %v, want unsynced", names(pods))
	}
}

// TestRetryWhenTheSampleIsFull checks that a pod turned away by every node
// of a sample kube-scheduler sent (exactly sampleSize of the nodes, with
// percentageOfNodesToScore below 100) is due at once when a node it was
// not sent fits it; and not when the list is shorter (kube-scheduler's
// own filters let only those through) or no other node fits.
func TestRetryWhenTheSampleIsFull(t *testing.T) {
	var objs []runtime.Object
	var full []string
	for i := range 100 {
		name := fmt.Sprintf("full-%03d", i)
		_, o := gpuNode(name, 1, 4096)
		objs = append(objs, o...)
		full = append(full, name)
	}
	_, free := gpuNode("free", 1, 16384)
	e := newEnv(t, testConfig(), objects(objs, free)...)
	due := func() []string {
		_, pods, _ := e.s.dueRetries()
		var names []string
		for _, p := range pods {
			names = append(names, p.name)
		}
		return names
	}
	// 101 nodes: kube-scheduler's adaptive sample is 100 of them.
	filtered := slicePod("filtered", 8192)
	if got := e.filter(filtered, full[:99]...); len(*got.NodeNames) != 0 {
		t.Fatalf("filtered passed a full node: %+v", got)
	}
	if got := due(); len(got) != 0 {
		t.Errorf("due after 99 full nodes (not a sample): %v, want none", got)
	}
	sampled := slicePod("sampled", 8192)
	e.filter(sampled, full...)
	if got := due(); !slices.Equal(got, []string{"sampled"}) {
		t.Errorf("due after a sample of full nodes with room elsewhere: %v, want sampled", got)
	}
	big := slicePod("big", 32768)
	e.filter(big, full...)
	if got := due(); len(got) != 0 {
		t.Errorf("due with no room anywhere: %v, want none", got)
	}
}

// TestSampleSize checks sampleSize against kube-scheduler's rule.
func TestSampleSize(t *testing.T) {
	tests := []struct{ percentage, all, want int }{
		{0, 50, 50}, {0, 100, 100}, {0, 101, 100}, {0, 1000, 420}, {0, 5000, 500}, {0, 10000, 500},
		{100, 1000, 1000}, {30, 1000, 300}, {30, 200, 100},
	}
	for _, tt := range tests {
		if got := sampleSize(tt.percentage, tt.all); got != tt.want {
			t.Errorf("sampleSize(%d, %d) = %d, want %d", tt.percentage, tt.all, got, tt.want)
		}
	}
}

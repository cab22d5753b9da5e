package retry

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

var now = time.Date(2026, 3, 14, 9, 30, 0, 0, time.UTC)

// pod is a pod named name; the tests' demand is its name.
func pod(name string) *corev1.Pod { return vgputest.Pod(name).Obj() }

// TestRetriesOrder checks which pods are due: those turned away by a Filter
// that read the state before the latest change, not those turned away
// after it, and a Filter that raced a change wakes the loop.
func TestRetriesOrder(t *testing.T) {
	r := New[string](nil)
	before, after, racing := pod("before"), pod("after"), pod("racing")
	r.Rejected(before, before.Name, r.Seen(), onNode(0, ClassNotReady))
	woken := func() bool {
		select {
		case <-r.Wake():
			return true
		default:
			return false
		}
	}
	if woken() {
		t.Fatal("woken with no change")
	}
	racingSeen := r.Seen() // a Filter starts, then the change lands
	changedAt := now.Add(time.Second)
	r.NodeReady(changedAt, 0)
	if !woken() {
		t.Fatal("a change with a pod waiting did not wake the loop")
	}
	r.Rejected(after, after.Name, r.Seen(), onNode(0, ClassNotReady))
	if woken() {
		t.Fatal("a rejection after the change woke the loop")
	}
	r.Rejected(racing, racing.Name, racingSeen, onNode(0, ClassNotReady))
	if !woken() {
		t.Fatal("a rejection by a Filter that started before the change did not wake the loop")
	}
	at, pods, again := r.Due(now, allFit)
	if !at.Equal(changedAt) || again != 0 {
		t.Errorf("due at %v, again in %v; want %v and no other pass", at, again, changedAt)
	}
	if names := podNames(pods); !slices.Equal(names, []string{"before", "racing"}) {
		t.Errorf("due pods %v, want before and racing", names)
	}
	if _, pods, _ := r.Due(now, allFit); len(pods) != 0 {
		t.Errorf("pods due twice: %v", pods)
	}
	for _, p := range []*corev1.Pod{before, after, racing} {
		r.Forget(p.UID)
	}
	r.NodeReady(changedAt.Add(time.Second), 0)
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
	r := New[string](nil)
	r.Rejected(pod("waiter"), "waiter", r.Seen(), onNode(0, ClassCapacity))
	seen := r.Seen() // a Filter of the racing pod starts
	r.Freed(now, 1)
	racing := pod("racing")
	r.Rejected(racing, racing.Name, seen, onNode(0, ClassCapacity))
	if _, pods, _ := r.Due(now, allFit); len(pods) != 0 {
		t.Errorf("due after a change on another node: %v", pods)
	}
	seen = r.Seen()
	r.Freed(now, 0)
	r.Rejected(racing, racing.Name, seen, onNode(0, ClassCapacity))
	_, pods, _ := r.Due(now, allFit)
	if names := podNames(pods); !slices.Equal(names, []string{"racing", "waiter"}) {
		t.Errorf("due after a change on their node: %v, want racing and waiter", names)
	}
	// Nobody waits: the next change is counted but not recorded by node.
	r.Forget("uid-waiter")
	r.Forget(racing.UID)
	seen = r.Seen()
	r.Freed(now, 1)
	r.Rejected(racing, racing.Name, seen, onNode(0, ClassCapacity))
	if _, pods, _ := r.Due(now.Add(Interval), allFit); len(pods) != 1 {
		t.Errorf("a Filter that raced an unrecorded change: due %v, want it", pods)
	}
}

// podNames are the names of pods, sorted.
func podNames(pods []Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// TestRetriesPacing checks the limits on writes: at most Batch pods
// per pass, the most recently turned away first, and one pod at most once
// per Interval however many changes come.
func TestRetriesPacing(t *testing.T) {
	r := New[string](nil)
	var pods []*corev1.Pod
	for i := range Batch + 5 {
		p := pod(fmt.Sprintf("p%02d", i))
		pods = append(pods, p)
		r.Rejected(p, p.Name, r.Seen(), onNode(0, ClassNotReady))
		r.NodeReady(now, 0) // each pod is turned away one change later than the one before
	}
	_, first, again := r.Due(now, allFit)
	if len(first) != Batch || again <= 0 || again > Delay {
		t.Fatalf("first pass: %d pods, again in %v; want %d and another pass soon", len(first), again, Batch)
	}
	for _, p := range first {
		if p.Name < "p05" {
			t.Errorf("%s asked in the first pass before a pod turned away later", p.Name)
		}
	}
	_, second, again := r.Due(now, allFit)
	if len(second) != 5 || again != 0 {
		t.Fatalf("second pass: %d pods, again in %v; want the 5 left and no other pass", len(second), again)
	}

	// Every pod is turned away again, and another change comes 10 s later:
	// all were asked within Interval, so none is due until it ends.
	for _, p := range pods {
		r.Rejected(p, p.Name, r.Seen(), onNode(0, ClassNotReady))
	}
	r.NodeReady(now.Add(10*time.Second), 0)
	_, none, again := r.Due(now.Add(10*time.Second), allFit)
	if len(none) != 0 || again != Interval-10*time.Second {
		t.Fatalf("within Interval: %d pods, again in %v; want none and a pass in %v", len(none), again, Interval-10*time.Second)
	}
	_, third, _ := r.Due(now.Add(Interval), allFit)
	if len(third) != Batch {
		t.Errorf("after Interval: %d pods, want %d", len(third), Batch)
	}
}

// TestRetriesFailed checks that a pod whose retry request failed is due
// again in the next pass, not only after Interval and a new change.
func TestRetriesFailed(t *testing.T) {
	r := New[string](nil)
	p := pod("p")
	r.Rejected(p, p.Name, r.Seen(), onNode(0, ClassNotReady))
	r.NodeReady(now, 0)
	_, pods, _ := r.Due(now, allFit)
	if len(pods) != 1 {
		t.Fatalf("due: %d pods, want 1", len(pods))
	}
	<-r.Wake() // the change's signal
	r.Failed(pods[0])
	select {
	case <-r.Wake():
	default:
		t.Error("a failed request did not wake the loop")
	}
	if _, again, _ := r.Due(now.Add(Delay), allFit); len(again) != 1 {
		t.Errorf("after a failed request: %d pods due, want 1", len(again))
	}
	// A request that failed after the pod was forgotten brings nothing back.
	r.Forget(p.UID)
	r.Failed(pods[0])
	if _, none, _ := r.Due(now.Add(2*Delay), allFit); len(none) != 0 {
		t.Errorf("forgotten pod due again: %+v", none)
	}
}

// onNode is a rejection by the node with index node for a reason of class.
func onNode(node int, class Class) Rejection {
	var rej Rejection
	rej.nodes[class].add(node)
	return rej
}

// allFit is a due fits that says every pod fits every node.
func allFit(*string, int) bool { return true }

// TestRetriesTargeted checks that a change wakes only the pods a node
// turned away for a reason of a class the change may cure, and only when
// the pod fits that node now.
func TestRetriesTargeted(t *testing.T) {
	r := New[string](nil)
	memory := pod("memory")      // node 0: insufficient memory
	notReady := pod("not-ready") // node 1: plugin not ready
	model := pod("model")        // node 0: wrong model
	r.Rejected(memory, memory.Name, r.Seen(), onNode(0, ClassCapacity))
	r.Rejected(notReady, notReady.Name, r.Seen(), onNode(1, ClassNotReady))
	r.Rejected(model, model.Name, r.Seen(), onNode(0, ClassInventory))
	var asked [][2]string
	fitsIf := func(ok bool) func(name *string, node int) bool {
		return func(name *string, node int) bool {
			asked = append(asked, [2]string{*name, fmt.Sprint(node)})
			return ok
		}
	}
	steps := []struct {
		name   string
		node   int
		change func(at time.Time, node int)
		fits   bool
		want   []string
		judged [][2]string
	}{
		{name: "freed on node 1 cures nothing there", node: 1, change: r.Freed, fits: true},
		{name: "freed on node 0, memory still short", node: 0, change: r.Freed, fits: false, judged: [][2]string{{"memory", "0"}}},
		{name: "freed on node 0, memory fits", node: 0, change: r.Freed, fits: true, want: []string{"memory"}, judged: [][2]string{{"memory", "0"}}},
		{name: "node 1 ready", node: 1, change: r.NodeReady, fits: true, want: []string{"not-ready"}, judged: [][2]string{{"not-ready", "1"}}},
		// An inventory change may cure capacity too.
		{name: "inventory of node 0", node: 0, change: r.InventoryChanged, fits: true, want: []string{"memory", "model"}, judged: [][2]string{{"memory", "0"}, {"model", "0"}}},
	}
	for i, st := range steps {
		asked = nil
		st.change(now, st.node)
		_, pods, _ := r.Due(now.Add(time.Duration(i)*Interval), fitsIf(st.fits))
		if diff := cmp.Diff(st.want, podNames(pods)); diff != "" {
			t.Errorf("%s: woken (-want +got):\n%s", st.name, diff)
		}
		slices.SortFunc(asked, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
		if diff := cmp.Diff(st.judged, asked); diff != "" {
			t.Errorf("%s: fits asked (-want +got):\n%s", st.name, diff)
		}
	}
	// A pod turned away before the caches synced is woken by the sync.
	for _, p := range []*corev1.Pod{memory, notReady, model} {
		r.Forget(p.UID)
	}
	unsynced := pod("unsynced")
	r.Rejected(unsynced, unsynced.Name, r.Seen(), Rejection{Unjudged: true})
	r.Synced(now)
	if _, pods, _ := r.Due(now.Add(10*Interval), fitsIf(false)); !slices.Equal(podNames(pods), []string{"unsynced"}) {
		t.Errorf("after the sync: woken %v, want unsynced", podNames(pods))
	}
}

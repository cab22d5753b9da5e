package soak

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Invariants a Violation names.
const (
	InvariantCapacity  = "capacity"
	InvariantExact     = "exact allocation"
	InvariantExplained = "pending explained"
	InvariantCDILeak   = "no leaked CDI spec"
	InvariantSettled   = "settled after chaos"
	InvariantNoLeak    = "no leaked reservation"
	InvariantReusable  = "freed slices reusable"
	InvariantRecovered = "component recovered"
	InvariantNoCrash   = "no gpuslice crash"
)

// Violation is one broken invariant.
type Violation struct {
	// At is when it was seen.
	At time.Time
	// Invariant is one of the Invariant constants.
	Invariant string
	// Detail names the objects involved.
	Detail string
}

// String renders the violation on one line.
func (v Violation) String() string {
	return v.At.Format("15:04:05.000") + " " + v.Invariant + ": " + v.Detail
}

// Report is what a soak did and found.
type Report struct {
	// Elapsed is the whole run, chaos and checks after it.
	Elapsed time.Duration
	// Created, Deleted and CreateRefused count the driver's pods: created, deleted by the
	// driver (each settle phase's deletions included), and creations the API server refused
	// (down, or the webhook down: GPU pods are refused then), by the start of the error.
	Created, Deleted int
	CreateRefused    map[string]int
	// NeverFit counts the pods created that no node can hold.
	NeverFit int
	// RunningPeak is the most pods seen Running at one check; RunningAtEnd how many the
	// settle phase saw Running once every pod that fits ran.
	RunningPeak, RunningAtEnd int
	// FailedAtAdmission counts pods a kubelet refused (phase Failed), by reason;
	// FailedExample holds the message of the latest one of each reason.
	FailedAtAdmission map[string]int
	FailedExample     map[string]string
	// LostAtAdmission counts, of those, the pods the kubelet refused for want of
	// devices (lostAtAdmission: UnexpectedAdmissionError, OutOf<resource>), a bare pod
	// lost to its user. The goal is 0; it is a figure, not a violation: a pod bound in the
	// moment before its node's plugin or kubelet went away, or admitted by a restarted
	// kubelet before the plugin registered with it again, fails so whatever gpuslice does
	// (docs/registration.md, "What remains"). LostExamples describes the latest
	// maxLostExamples: node, binding, when the soak saw the failure, the kubelet's message.
	LostAtAdmission int
	LostExamples    []string
	// Faults counts the faults injected, by kind.
	Faults map[string]int
	// HandOvers are, for each "leader hand-over" fault, the time from the leading scheduler
	// pair's end to another pair's kube-scheduler holding the leader Lease; HandOverFailed
	// counts those after which no pair led within restartTimeout (each also a violation).
	HandOvers      []time.Duration
	HandOverFailed int
	// HeldWrites counts the extenders' API writes (binds, retry annotations, conditions,
	// events) the API proxy held during "API write latency" faults, so that they committed
	// late.
	HeldWrites int64
	// Crashes counts the processes that exited on their own, by process name, which the soak
	// restarted as a supervisor would; CrashExample holds the last log line of the latest.
	// A crash of a gpuslice component is also a violation.
	Crashes      map[string]int
	CrashExample map[string]string
	// Checks counts the passes of the continuous checks that ran; ChecksSkipped those that
	// could not read the API server or the nodes (being restarted).
	Checks, ChecksSkipped int
	// RecordsChecked counts the CreateContainer records compared with their pod's allocation;
	// RecordsUnchecked those whose pod the informer never saw with an allocation (created and
	// deleted while it was relisting after an API server restart).
	RecordsChecked, RecordsUnchecked int
	// StartedWhileDeleting counts the containers the kubelet created with no slice at all for
	// pods whose deletion had been seen before (a kubelet race, not a violation: nobody else's
	// slice was given); StartedWhileDeletingExample describes the latest.
	StartedWhileDeleting        int
	StartedWhileDeletingExample string
	// Violations are the broken invariants, in the order seen.
	Violations []Violation
}

// String is the summary the soak prints.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "soak summary (%v)\n", r.Elapsed.Round(time.Second))
	fmt.Fprintf(&b, "  pods: %d created (%d that never fit), %d deleted, %d Running at most, %d Running after the chaos\n",
		r.Created, r.NeverFit, r.Deleted, r.RunningPeak, r.RunningAtEnd)
	fmt.Fprintf(&b, "  creations refused: %s\n", counts(r.CreateRefused))
	fmt.Fprintf(&b, "  pods failed at kubelet admission: %s\n", counts(r.FailedAtAdmission))
	for _, reason := range slices.Sorted(maps.Keys(r.FailedExample)) {
		fmt.Fprintf(&b, "    e.g. %s: %s\n", reason, r.FailedExample[reason])
	}
	fmt.Fprintf(&b, "  pods lost at kubelet admission for want of devices: %d (goal 0)\n", r.LostAtAdmission)
	for _, e := range r.LostExamples {
		fmt.Fprintf(&b, "    %s\n", e)
	}
	total := 0
	for _, n := range r.Faults {
		total += n
	}
	fmt.Fprintf(&b, "  faults injected: %d: %s\n", total, counts(r.Faults))
	fmt.Fprintf(&b, "  leader hand-overs: %d, %s\n", len(r.HandOvers)+r.HandOverFailed, handOverFigures(r.HandOvers, r.HandOverFailed))
	fmt.Fprintf(&b, "  extender writes held by the API proxy (committed late): %d\n", r.HeldWrites)
	fmt.Fprintf(&b, "  crashes (restarted by the soak): %s\n", counts(r.Crashes))
	for _, name := range slices.Sorted(maps.Keys(r.CrashExample)) {
		fmt.Fprintf(&b, "    %s, last log line: %s\n", name, r.CrashExample[name])
	}
	fmt.Fprintf(&b, "  invariant passes: %d (%d skipped while the API server was down)\n", r.Checks, r.ChecksSkipped)
	fmt.Fprintf(&b, "  container records checked: %d (%d whose pod was never seen allocated)\n", r.RecordsChecked, r.RecordsUnchecked)
	fmt.Fprintf(&b, "  containers the kubelet started with no slice for a pod already being deleted: %d\n", r.StartedWhileDeleting)
	if r.StartedWhileDeletingExample != "" {
		fmt.Fprintf(&b, "    e.g. %s\n", r.StartedWhileDeletingExample)
	}
	fmt.Fprintf(&b, "  violations: %d\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "    %s\n", v)
	}
	return b.String()
}

// handOverFigures renders the hand-over times as "new leader after p50 … / max …" and the
// failed ones.
func handOverFigures(d []time.Duration, failed int) string {
	s := "none timed"
	if len(d) > 0 {
		sorted := slices.Sorted(slices.Values(d))
		s = fmt.Sprintf("new leader after p50 %v / max %v", sorted[len(sorted)/2].Round(10*time.Millisecond), sorted[len(sorted)-1].Round(10*time.Millisecond))
	}
	return fmt.Sprintf("%s, %d without a new leader", s, failed)
}

// counts renders a count map as "a 3, b 1" in key order, or "none".
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// maxLostExamples is how many pods lost at admission Report.LostExamples describes.
const maxLostExamples = 8

// lostAtAdmission reports whether a Failed pod's status reason says the kubelet refused it
// at admission for want of devices: UnexpectedAdmissionError (the device manager's Allocate
// failed: "requested number of devices unavailable", "no healthy devices present", an
// Allocate error of the plugin) or OutOf<resource> (the Node's allocatable did not hold it).
func lostAtAdmission(reason string) bool {
	return reason == "UnexpectedAdmissionError" || strings.HasPrefix(reason, "OutOf")
}

// tally collects a run's figures from the driver, the chaos loop and the checks. Safe for
// concurrent use.
type tally struct {
	mu      sync.Mutex
	r       Report
	elapsed time.Duration
	// reported keeps the keys of violations already reported, so that a lasting one is
	// reported once.
	reported map[string]bool
	// nodeFaults are the kubelet and device plugin restarts of each node, by node name, in
	// the order they began: a pod lost at admission is told beside the latest one before it.
	nodeFaults map[string][]nodeFault
}

// nodeFault is one restart of a node's kubelet or device plugin.
type nodeFault struct {
	at   time.Time
	kind string // "kubelet SIGKILL", "device plugin SIGTERM", ...
}

// nodeFault records that kind began on node at at.
func (t *tally) nodeFault(node, kind string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nodeFaults[node] = append(t.nodeFaults[node], nodeFault{at: at, kind: kind})
}

// lastNodeFault describes the latest kubelet or plugin restart of node that began before
// before, relative to bound (the pod's bind), or says there was none. Callers hold t.mu.
func (t *tally) lastNodeFault(node string, bound, before time.Time) string {
	faults := t.nodeFaults[node]
	for i := len(faults) - 1; i >= 0; i-- {
		f := faults[i]
		if f.at.After(before) {
			continue
		}
		rel := fmt.Sprintf("%v after the bind", f.at.Sub(bound).Round(100*time.Millisecond))
		if f.at.Before(bound) {
			rel = fmt.Sprintf("%v before the bind", bound.Sub(f.at).Round(100*time.Millisecond))
		}
		return fmt.Sprintf("latest restart on %s: %s at %s, %s", node, f.kind, f.at.Format("15:04:05.000"), rel)
	}
	return "no kubelet or plugin restart on " + node + " before it"
}

func newTally() *tally {
	return &tally{
		r: Report{CreateRefused: map[string]int{}, FailedAtAdmission: map[string]int{}, FailedExample: map[string]string{}, Faults: map[string]int{},
			Crashes: map[string]int{}, CrashExample: map[string]string{}},
		reported: map[string]bool{}, nodeFaults: map[string][]nodeFault{},
	}
}

// violate records a violation of invariant, once per key.
func (t *tally) violate(invariant, key, detail string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.reported[invariant+"\x00"+key] {
		return
	}
	t.reported[invariant+"\x00"+key] = true
	t.r.Violations = append(t.r.Violations, Violation{At: time.Now(), Invariant: invariant, Detail: detail})
}

// failed counts the pod p, which a kubelet failed and the soak saw at seenAt, by its reason,
// and as lost at admission when lostAtAdmission says so.
func (t *tally) failed(p *corev1.Pod, seenAt time.Time) {
	reason := p.Status.Reason
	if reason == "" {
		reason = "no reason"
	}
	bound := waitingSince(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	cause := t.lastNodeFault(p.Spec.NodeName, bound, seenAt)
	func(r *Report) {
		r.FailedAtAdmission[reason]++
		r.FailedExample[reason] = fmt.Sprintf("%s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Message)
		if !lostAtAdmission(reason) {
			return
		}
		r.LostAtAdmission++
		e := fmt.Sprintf("%s on %s, bound %s, seen failed %s (%s): %s: %s", p.Name, p.Spec.NodeName,
			bound.Format("15:04:05.000"), seenAt.Format("15:04:05.000"), cause, reason, p.Status.Message)
		r.LostExamples = append(r.LostExamples, e)
		if len(r.LostExamples) > maxLostExamples {
			r.LostExamples = r.LostExamples[1:]
		}
	}(&t.r)
}

// add applies f to the report under the lock.
func (t *tally) add(f func(r *Report)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f(&t.r)
}

// brief is a one-line progress note.
func (t *tally) brief() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, v := range t.r.Faults {
		n += v
	}
	return fmt.Sprintf("%d pods created, %d deleted, %d faults, %d violations", t.r.Created, t.r.Deleted, n, len(t.r.Violations))
}

// report returns a copy of the report.
func (t *tally) report() *Report {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.r
	r.Elapsed = t.elapsed
	r.CreateRefused = maps.Clone(t.r.CreateRefused)
	r.FailedAtAdmission = maps.Clone(t.r.FailedAtAdmission)
	r.FailedExample = maps.Clone(t.r.FailedExample)
	r.Faults = maps.Clone(t.r.Faults)
	r.Crashes = maps.Clone(t.r.Crashes)
	r.CrashExample = maps.Clone(t.r.CrashExample)
	r.LostExamples = slices.Clone(t.r.LostExamples)
	r.HandOvers = slices.Clone(t.r.HandOvers)
	r.Violations = slices.Clone(t.r.Violations)
	return &r
}

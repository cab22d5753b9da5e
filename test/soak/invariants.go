package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/test/fakecri"
	"github.com/gpuslice/gpuslice/vgpu"
)

const (
	// cdiSpecPrefix starts the name of every CDI spec file the device plugin writes
	// (gpuslice.io-vgpu_<key of the device IDs>.json; a release before named it after the
	// device); cdiDevicePrefix every CDI device it names.
	cdiSpecPrefix   = "gpuslice.io-vgpu_"
	cdiDevicePrefix = "gpuslice.io/vgpu="
	// cdiSpecLife is how long a spec no live container uses may stay: the plugin removes such
	// specs once a minute (and at its start) when they are over a minute old, so within two
	// minutes; a collection is skipped while the kubelet's PodResources does not answer (the
	// kubelet is down, or its rate limit refuses the call during a burst of container starts),
	// and this allows for two skipped in a row.
	cdiSpecLife = 5 * time.Minute
	// unseenGrace is how long a CreateContainer record may wait for its pod to be seen with an
	// allocation before it counts as unchecked.
	unseenGrace = 30 * time.Second
)

// checkLoop checks the invariants every checkInterval until ctx ends, and once more then.
func (s *soak) checkLoop(ctx context.Context) {
	for pause(ctx, checkInterval) {
		s.check(ctx, s.rc)
	}
	s.check(context.Background(), s.rc)
}

// check checks every invariant once. A pass that cannot read the API server (it is being
// restarted) checks nothing.
func (s *soak) check(ctx context.Context, rc *recordCheck) {
	list, err := s.c.Client().CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		s.tally.add(func(r *Report) { r.ChecksSkipped++ })
		return
	}
	holding := holdingPods(list.Items)
	running := 0
	for _, p := range list.Items {
		s.seen.pod(&p)
		if p.Status.Phase == corev1.PodRunning {
			running++
		}
	}
	s.tally.add(func(r *Report) { r.RunningPeak = max(r.RunningPeak, running) })
	if !s.checkCapacity(ctx, holding) {
		s.tally.add(func(r *Report) { r.ChecksSkipped++ })
		return
	}
	s.tally.add(func(r *Report) { r.Checks++ })
	s.checkRecords(rc)
	s.checkPending(list.Items)
	s.checkCDISpecs(holding)
}

// holdingPods returns the pods that hold GPUs: bound and not finished (being deleted included).
func holdingPods(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.Spec.NodeName != "" && p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
			out = append(out, p)
		}
	}
	return out
}

// checkCapacity reports every GPU whose slices exceed it, and false when the nodes could not be
// read (the API server went down during the pass).
func (s *soak) checkCapacity(ctx context.Context, holding []corev1.Pod) bool {
	bad, err := s.c.CapacityViolations(ctx, holding)
	if err != nil {
		return false
	}
	for _, b := range bad {
		s.tally.violate(InvariantCapacity, b, b)
	}
	return true
}

// recordCheck is how far checkRecords has read each node's CreateContainer records, and the
// records still waiting for their pod to be seen with an allocation.
type recordCheck struct {
	read    map[string]int
	waiting []waitingRecord
}

// waitingRecord is a record of node whose pod was not yet seen with an allocation, since first.
type waitingRecord struct {
	node  string
	r     fakecri.Record
	first time.Time
}

func newRecordCheck() *recordCheck { return &recordCheck{read: map[string]int{}} }

// checkRecords compares every new CreateContainer record, and those still waiting, with the
// allocation of its pod as the informer last saw it.
func (s *soak) checkRecords(rc *recordCheck) {
	now := time.Now()
	pending := rc.waiting
	rc.waiting = nil
	for _, n := range s.c.Nodes {
		records, err := n.CRIRecords()
		if err != nil {
			s.tally.violate(InvariantExact, "read "+n.Name, fmt.Sprintf("read the CreateContainer records of %s: %v", n.Name, err))
			continue
		}
		for _, r := range records[min(rc.read[n.Name], len(records)):] {
			pending = append(pending, waitingRecord{node: n.Name, r: r, first: now})
		}
		rc.read[n.Name] = len(records)
	}
	for _, w := range pending {
		p := s.seen.allocatedPod(types.UID(w.r.PodUID))
		switch {
		case p != nil:
			s.checkRecord(w.node, w.r, p)
		case now.Sub(w.first) < unseenGrace:
			rc.waiting = append(rc.waiting, w)
		default:
			s.tally.add(func(r *Report) { r.RecordsUnchecked++ })
		}
	}
}

// checkRecord compares one CreateContainer record of node with the allocation of its pod p.
func (s *soak) checkRecord(node string, r fakecri.Record, p *corev1.Pod) {
	s.tally.add(func(r *Report) { r.RecordsChecked++ })
	key := fmt.Sprintf("%s/%s/%s#%d", node, r.PodUID, r.Container, r.Attempt)
	what := fmt.Sprintf("container %s of %s/%s (UID %s) created on %s", r.Container, r.Namespace, r.Pod, r.PodUID, node)
	alloc, err := vgpu.ParsePodAllocation(p.Annotations[vgpu.AnnotationPodAllocation])
	if err != nil {
		s.tally.violate(InvariantExact, key, fmt.Sprintf("%s: allocation annotation: %v", what, err))
		return
	}
	if alloc.Node != node {
		s.tally.violate(InvariantExact, key, fmt.Sprintf("%s: its allocation is for node %s", what, alloc.Node))
	}
	ca, ok := alloc.Container(r.Container)
	if !ok {
		s.tally.violate(InvariantExact, key, fmt.Sprintf("%s: its pod's allocation has no such container: %s", what, p.Annotations[vgpu.AnnotationPodAllocation]))
		return
	}
	if len(r.CDIDevices) == 0 && r.Env["GPUSLICE_POD_UID"] == "" {
		if since, ok := s.seen.deletingSince(types.UID(r.PodUID)); ok && !r.Created.IsZero() && r.Created.After(since) {
			// The kubelet starts a container of a pod it no longer counts active without
			// devices (pkg/kubelet/cm/devicemanager/manager.go:995, "Pod deleted from
			// activePods, skip to reAllocate"), once it has handed them to another pod; the
			// plugin is not asked. The container got nothing, and is killed with its pod.
			s.tally.add(func(rep *Report) {
				rep.StartedWhileDeleting++
				rep.StartedWhileDeletingExample = fmt.Sprintf("%s %v after its deletion was seen, with no slice (its allocation is %v)", what, r.Created.Sub(since).Round(time.Millisecond), ca.GPUs)
			})
			return
		}
		s.tally.violate(InvariantExact, key, fmt.Sprintf("%s started without its slice: no CDI device and no GPU environment, though its allocation is %v", what, ca.GPUs))
		return
	}
	if bad := cluster.EnvMismatches(p, ca, r.Env); len(bad) > 0 {
		s.tally.violate(InvariantExact, key, fmt.Sprintf("%s got another allocation than its own (CDI devices %v): %s", what, r.CDIDevices, strings.Join(bad, "; ")))
	}
}

// checkPending reports every pod Pending for over pendingGrace without an event that says why:
// an unbound pod needs a FailedScheduling event within pendingGrace of its creation, a bound one
// an event other than Scheduled (the kubelet's or the device plugin's) within pendingGrace of its
// binding: Scheduled explains the wait until then.
func (s *soak) checkPending(pods []corev1.Pod) {
	now := time.Now()
	for _, p := range pods {
		if p.Status.Phase != corev1.PodPending || p.DeletionTimestamp != nil || now.Sub(waitingSince(&p)) < pendingGrace {
			continue
		}
		reasons := s.seen.eventReasons(p.UID)
		explained := false
		for _, r := range reasons {
			explained = explained || (p.Spec.NodeName == "" && r == "FailedScheduling") || (p.Spec.NodeName != "" && r != "Scheduled")
		}
		if !explained {
			slices.Sort(reasons)
			s.tally.violate(InvariantExplained, string(p.UID), fmt.Sprintf("pod %s (UID %s, node %q) Pending for %v (%v since its last step) with events %v and conditions %s",
				p.Name, p.UID, p.Spec.NodeName, now.Sub(p.CreationTimestamp.Time).Round(time.Second), now.Sub(waitingSince(&p)).Round(time.Second), reasons, conditions(&p)))
		}
	}
}

// waitingSince is when a Pending pod began waiting on its current step: its binding
// (PodScheduled turning true) once bound, else its creation.
func waitingSince(p *corev1.Pod) time.Time {
	if p.Spec.NodeName != "" {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue && !c.LastTransitionTime.IsZero() {
				return c.LastTransitionTime.Time
			}
		}
	}
	return p.CreationTimestamp.Time
}

// conditions renders a pod's conditions in a few words.
func conditions(p *corev1.Pod) string {
	var parts []string
	for _, c := range p.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// checkCDISpecs reports every device plugin CDI spec that no container of a pod holding GPUs has
// used for over cdiSpecLife: the time counts from the first check that found it unused (or
// from its writing, if later), not from its writing, since a spec lives as long as its pod.
func (s *soak) checkCDISpecs(holding []corev1.Pod) {
	live := map[string]bool{}
	uids := map[string]bool{}
	for _, p := range holding {
		uids[string(p.UID)] = true
	}
	for _, n := range s.c.Nodes {
		records, err := n.CRIRecords()
		if err != nil {
			continue // reported by checkRecords
		}
		for _, r := range records {
			if uids[r.PodUID] {
				for _, d := range r.CDIDevices {
					live[strings.TrimPrefix(d, cdiDevicePrefix)] = true
				}
			}
		}
	}
	now := time.Now()
	unused := map[string]time.Time{}
	for _, n := range s.c.Nodes {
		for path, written := range unusedSpecs(n.CDISpecDir(), live) {
			since, ok := s.specUnusedSince[path]
			if !ok {
				since = now
			}
			if written.After(since) {
				since = written // written again since: used then
			}
			unused[path] = since
			if now.Sub(since) > cdiSpecLife {
				s.tally.violate(InvariantCDILeak, path, fmt.Sprintf("node %s: %s, written %v ago, used by no pod that holds GPUs for %v", n.Name, path,
					now.Sub(written).Round(time.Second), now.Sub(since).Round(time.Second)))
			}
		}
	}
	s.specUnusedSince = unused
}

// unusedSpecs returns, by path, when each of the plugin's spec files in dir that defines no device
// in live was last written. The plugin keeps one file per set of device IDs, which each holder of
// the IDs rewrites with its own device, so the devices are read from the file, not its name.
func unusedSpecs(dir string, live map[string]bool) map[string]time.Time {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := map[string]time.Time{}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), cdiSpecPrefix) || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		// A file that cannot be read (removed meanwhile) defines nothing in use.
		names, _ := handoff.SpecDevices(path)
		if slices.ContainsFunc(names, func(d string) bool { return live[d] }) {
			continue
		}
		if info, err := e.Info(); err == nil {
			out[path] = info.ModTime()
		}
	}
	return out
}

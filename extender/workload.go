package extender

import (
	"context"
	"sync"
	"time"

	"github.com/gpuslice/gpuslice/extender/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// The online workload (Config.Workload "online") learns what the
// fragmentation policy measures against from the pods the extender sees
// arrive, as gpuslice simulate does: every pod, GPU or not, is counted
// once when the pod informer first sees it, with weights that halve every
// Config.WorkloadHalfLife pods. Filter and Prioritize never read the
// counting workload itself: they read a snapshot that the state's node
// summaries were measured against, and a new snapshot replaces it every
// few pods.
const (
	// DefaultWorkloadHalfLife is the online workload's half life in pods,
	// the simulator's default.
	DefaultWorkloadHalfLife = 2000
	// workloadMaxClasses bounds a snapshot's classes (shape and host
	// request): Fit weighs each class of a node it measures, so a cluster
	// of pods with thousands of distinct requests keeps only the heaviest.
	// The counting workload is cut to this when it holds twice as many.
	workloadMaxClasses = 256
	// workloadRefreshPods is the most pods counted between snapshots; a
	// young workload is snapshotted more often (every tenth of the pods
	// counted so far), so that the first pods of a cluster do not leave it
	// measured against a handful.
	workloadRefreshPods = 100
	// workloadFlush is the longest a counted pod waits for a snapshot.
	workloadFlush = time.Second
)

// WorkloadSource is where the fragmentation policy's workload comes from.
type WorkloadSource string

const (
	// WorkloadOnline learns the workload from the pods the extender sees
	// (the default).
	WorkloadOnline WorkloadSource = "online"
	// WorkloadDefault uses vgpu.DefaultWorkload, shaped after Alibaba's
	// GPU-sharing trace, whatever the cluster runs.
	WorkloadDefault WorkloadSource = "default"
)

// workloadTracker counts arriving pods into the online workload and says
// when a new snapshot is due. Safe for concurrent use.
type workloadTracker struct {
	mu   sync.Mutex
	live *vgpu.Workload
	// counted is every pod counted; since those since the last snapshot.
	counted, since int
	// due is signalled (without blocking) when a snapshot is due.
	due chan struct{}
}

func newWorkloadTracker(halfLife float64) *workloadTracker {
	live := &vgpu.Workload{}
	live.SetHalfLife(halfLife)
	return &workloadTracker{live: live, due: make(chan struct{}, 1)}
}

// add counts one arriving pod.
func (t *workloadTracker) add(pod vgpu.PodDemand) {
	t.mu.Lock()
	t.live.Add(pod)
	t.counted++
	t.since++
	due := t.since >= min(workloadRefreshPods, max(1, t.counted/10))
	t.mu.Unlock()
	if due {
		t.signal()
	}
}

func (t *workloadTracker) signal() {
	select {
	case t.due <- struct{}{}:
	default:
	}
}

// snapshot returns a copy of the workload for readers, or nil when no pod
// was counted since the last one.
func (t *workloadTracker) snapshot() *vgpu.Workload {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.since == 0 {
		return nil
	}
	t.since = 0
	if t.live.Len() > 2*workloadMaxClasses {
		t.live = t.live.Snapshot(workloadMaxClasses)
	}
	return t.live.Snapshot(workloadMaxClasses)
}

// workloadLoop publishes a new snapshot of the online workload whenever
// one is due, or every workloadFlush while pods counted wait for one,
// until ctx ends.
func (s *Scheduler) workloadLoop(ctx context.Context) {
	t := s.workload
	t.signal() // the pods of the informers' first lists
	// Pods counted since the last snapshot wait at most a tick when no
	// more arrive.
	tick := time.NewTicker(workloadFlush)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.due:
		case <-tick.C:
		}
		if w := t.snapshot(); w != nil {
			s.state.SetWorkload(w)
		}
	}
}

// podArrived counts a pod the pod informer sees for the first time into
// the online workload, unless it finished already or its request is
// invalid (Filter says why to kube-scheduler). With Config.DRA, a pod
// that names resource claims is counted when PrioritizeDRA first scores it
// instead, once its claims, and so its GPU requests, are known.
func (s *Scheduler) podArrived(obj any) {
	var pod vgpu.PodDemand
	switch o := obj.(type) {
	case *podMeta:
		if o.Terminal || o.Claims && s.dra != nil {
			return
		}
		pod.Host = o.Host
	case *gpuPod:
		if cluster.Terminal(o.Phase) || len(o.ResourceClaims) > 0 && s.dra != nil {
			return
		}
		d, err := vgpu.DemandOf(o.pod())
		if err != nil {
			return
		}
		pod = d
	default:
		return
	}
	s.workload.add(pod)
}

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// slicePod returns a pod whose one container asks for one GPU slice of memMiB MiB (written as a
// plain integer, MiB) and, when cores > 0, that share of compute. The webhook fills in
// hami.io/gpu: 1 and the scheduler name.
func slicePod(name string, memMiB int64, cores int64) *corev1.Pod {
	limits := corev1.ResourceList{vgpu.ResourceMemory: *resource.NewQuantity(memMiB, resource.DecimalSI)}
	if cores > 0 {
		limits[vgpu.ResourceCores] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name:      "main",
				Image:     "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Limits: limits},
			}},
		},
	}
}

// podOutcome is where a pod ended up once the cluster settled.
type podOutcome struct {
	running []corev1.Pod
	pending []corev1.Pod
}

// waitSettled waits until every pod whose name starts with prefix is Running, or is Pending and
// unbound with a FailedScheduling event from the filters, and returns them split that way (each
// part in name order). It follows the pods through a watch of its own (podWatch.settled).
func waitSettled(t *testing.T, c *cluster.Cluster, prefix string, want int, timeout time.Duration) podOutcome {
	t.Helper()
	w := watchPods(t, c, nil)
	defer w.stop()
	return w.settled(t, c, prefix, want, timeout)
}

// podWatch follows the default namespace's pods through one informer.
type podWatch struct {
	store    cache.Store
	informer cache.Controller
	changed  chan struct{} // has a value after a pod was added, updated or deleted
	stop     context.CancelFunc
}

// watchPods starts a podWatch, stopped by its stop or t's cleanup. see, when not nil, is called
// with each pod the watch adds or updates, as it arrives.
func watchPods(t *testing.T, c *cluster.Cluster, see func(*corev1.Pod)) *podWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &podWatch{changed: make(chan struct{}, 1), stop: cancel}
	on := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && see != nil {
			see(p)
		}
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
	w.store, w.informer = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.NewListWatchFromClient(c.Client().CoreV1().RESTClient(), "pods", metav1.NamespaceDefault, fields.Everything()),
		ObjectType:    &corev1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    on,
			UpdateFunc: func(_, obj any) { on(obj) },
			DeleteFunc: on,
		},
	})
	go w.informer.RunWithContext(ctx)
	return w
}

// waitListed waits up to timeout until the watch has listed the pods, so that what it sees next
// arrives as it happens.
func (w *podWatch) waitListed(t *testing.T, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
		t.Fatalf("the pod watch did not list within %v", timeout)
	}
}

// settled is waitSettled on w: it lists FailedScheduling events only once every pod is Running
// or unbound with a filter verdict in its PodScheduled condition (kube-scheduler writes the event
// and the condition together, the event second): polling full lists of pods and events every
// 100 ms cost the API server 10–90 ms a list during a 40-pod burst, taking CPU from the
// components whose time the bursts measure.
func (w *podWatch) settled(t *testing.T, c *cluster.Cluster, prefix string, want int, timeout time.Duration) podOutcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The event may be written after the pod's last change: look again now and then.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	last := "the pod watch has not listed the pods yet"
	for {
		select {
		case <-ctx.Done():
			t.Fatalf("%d pods %s* Running or Pending with a FailedScheduling event: not within %v (last: %s)", want, prefix, timeout, last)
		case <-w.changed:
		case <-tick.C:
		}
		if !w.informer.HasSynced() {
			continue
		}
		out, done, seen := settledNow(ctx, t, c, w.store.List(), prefix, want)
		if ctx.Err() == nil { // keep the last real observation, not the deadline's error
			last = seen
		}
		if done {
			return out
		}
	}
}

// settledNow is waitSettled's check of the pods in objs whose names start with prefix: their
// outcome, whether they have settled, and what was seen, for a timeout's message. It fails t at
// once when a pod is Failed.
func settledNow(ctx context.Context, t *testing.T, c *cluster.Cluster, objs []any, prefix string, want int) (podOutcome, bool, string) {
	t.Helper()
	var pods []*corev1.Pod
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && strings.HasPrefix(p.Name, prefix) {
			pods = append(pods, p)
		}
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	var out podOutcome
	other := map[string]int{}
	for _, p := range pods {
		switch {
		case p.Status.Phase == corev1.PodRunning:
			out.running = append(out.running, *p)
		case p.Spec.NodeName == "" && strings.HasPrefix(unschedulableMessage(p), "0/"):
			// A filter verdict ("0/2 nodes are available: ..."). A failed bind
			// (another pod took the room between filter and bind) is also
			// reported as FailedScheduling, but the scheduler retries it.
			out.pending = append(out.pending, *p)
		case p.Status.Phase == corev1.PodFailed:
			// Terminal: waiting longer changes nothing.
			t.Fatalf("pod %s Failed on %s: %s: %s", p.Name, p.Spec.NodeName, p.Status.Reason, p.Status.Message)
		default:
			other[string(p.Status.Phase)+"@"+p.Spec.NodeName]++
		}
	}
	seen := fmt.Sprintf("%d pods: %d running, %d pending with a filter verdict, others %v", len(pods), len(out.running), len(out.pending), other)
	if len(pods) != want || len(other) > 0 {
		return out, false, seen
	}
	if len(out.pending) == 0 {
		return out, true, seen
	}
	failed, err := failedScheduling(ctx, c)
	if err != nil {
		return out, false, seen + "; " + err.Error()
	}
	for _, p := range out.pending {
		if !strings.HasPrefix(failed[p.UID], "0/") {
			return out, false, seen + "; no FailedScheduling event from the filters for " + p.Name + " yet"
		}
	}
	return out, true, seen
}

// unschedulableMessage is the message of pod's PodScheduled condition when it is False, else "".
func unschedulableMessage(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Message
		}
	}
	return ""
}

// failedScheduling returns the latest FailedScheduling message per pod UID in the default namespace.
func failedScheduling(ctx context.Context, c *cluster.Cluster) (map[types.UID]string, error) {
	return c.FailedScheduling(ctx, metav1.NamespaceDefault)
}

// waitPendingWith waits up to 30 s for the unbound pod name (default namespace) to have a
// FailedScheduling event containing want; it fails t at once if the pod gets bound.
func waitPendingWith(t *testing.T, c *cluster.Cluster, name, want string) {
	t.Helper()
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	poll(t, 30*time.Second, name+" Pending with "+strconv.Quote(want), func(ctx context.Context) (bool, string) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("%s bound to %s; want Pending", name, p.Spec.NodeName)
		}
		failed, err := failedScheduling(ctx, c)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(failed[p.UID], want), failed[p.UID]
	})
}

// checkExact compares each running pod's containers' environment, as the runtime resolved it at
// CreateContainer, with the pod's own allocation annotation, and returns one line per mismatch.
func checkExact(t *testing.T, c *cluster.Cluster, running []corev1.Pod) []string {
	t.Helper()
	records, err := c.LatestRecords()
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for i := range running {
		bad = append(bad, cluster.AllocationMismatches(&running[i], records)...)
	}
	return bad
}

// checkCapacity sums the allocations of pods per GPU and returns one line per GPU whose slices
// exceed its schedulable memory, split count or compute.
func checkCapacity(t *testing.T, c *cluster.Cluster, pods []corev1.Pod) []string {
	t.Helper()
	bad, err := c.CapacityViolations(context.Background(), pods)
	if err != nil {
		t.Fatal(err)
	}
	return bad
}

// deleteAll deletes every pod of the default namespace at once and waits until none is left.
func deleteAll(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	zero := int64(0)
	if err := pods.DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 2*time.Minute, "every pod deleted", func(ctx context.Context) (bool, string) {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items))
	})
}

// createAll creates pods concurrently (8 at a time), failing t on the first error.
func createAll(t *testing.T, c *cluster.Cluster, pods []*corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	errs := make(chan error, len(pods))
	sem := make(chan struct{}, 8)
	for _, p := range pods {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			_, err := c.Client().CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				err = fmt.Errorf("create pod %s: %w", p.Name, err)
			}
			errs <- err
		}()
	}
	for range pods {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

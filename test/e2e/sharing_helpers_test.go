package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
// unbound with a FailedScheduling event from the filters, and returns them split that way.
func waitSettled(t *testing.T, c *cluster.Cluster, prefix string, want int, timeout time.Duration) podOutcome {
	t.Helper()
	var out podOutcome
	poll(t, timeout, fmt.Sprintf("%d pods %s* Running or Pending with a FailedScheduling event", want, prefix), func(ctx context.Context) (bool, string) {
		out = podOutcome{}
		list, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		failed, err := failedScheduling(ctx, c)
		if err != nil {
			return false, err.Error()
		}
		other := map[string]int{}
		n := 0
		for _, p := range list.Items {
			if !strings.HasPrefix(p.Name, prefix) {
				continue
			}
			n++
			switch {
			case p.Status.Phase == corev1.PodRunning:
				out.running = append(out.running, p)
			case p.Spec.NodeName == "" && strings.HasPrefix(failed[p.UID], "0/"):
				// A filter verdict ("0/2 nodes are available: ..."). A failed bind
				// (another pod took the room between filter and bind) is also
				// reported as FailedScheduling, but the scheduler retries it.
				out.pending = append(out.pending, p)
			case p.Status.Phase == corev1.PodFailed:
				// Terminal: waiting longer changes nothing.
				t.Fatalf("pod %s Failed on %s: %s: %s", p.Name, p.Spec.NodeName, p.Status.Reason, p.Status.Message)
			default:
				other[string(p.Status.Phase)+"@"+p.Spec.NodeName]++
			}
		}
		return n == want && len(other) == 0, fmt.Sprintf("%d pods: %d running, %d pending with event, others %v", n, len(out.running), len(out.pending), other)
	})
	return out
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

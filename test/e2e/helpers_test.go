package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuslice/gpuslice/test/cluster"
)

// requireHost skips t where the cluster cannot run (not root, no unshare, binaries not built), or
// fails it when CI=true: CI must run these tests.
func requireHost(t *testing.T) {
	t.Helper()
	err := cluster.HostSupport()
	if err == nil {
		if binDir == "" {
			t.Fatal("e2e: TestMain did not build the gpuslice binaries")
		}
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("e2e: %v (CI=true: not skipping)", err)
	}
	t.Skipf("e2e: %v", err)
}

// startCluster starts a cluster with nodes, stopping it in t.Cleanup; when t failed, the tail of
// every component's log is logged first.
func startCluster(t *testing.T, nodes ...cluster.NodeOptions) *cluster.Cluster {
	t.Helper()
	return startClusterWith(t, clusterOptions(nodes...))
}

// startClusterWith starts a cluster with opts, as startCluster does.
func startClusterWith(t *testing.T, opts cluster.Options) *cluster.Cluster {
	t.Helper()
	requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began := time.Now()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		t.Fatalf("e2e: %v", err)
	}
	t.Logf("cluster with %d node(s) ready in %v (folder %s)", len(opts.Nodes), time.Since(began).Round(time.Millisecond), c.State.Dir)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("component logs:\n%s", c.LogTails(40))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
	})
	return c
}

// clusterOptions returns the options of a cluster with nodes that runs the binaries TestMain built
// and dies with the test binary.
func clusterOptions(nodes ...cluster.NodeOptions) cluster.Options {
	return cluster.Options{
		Nodes:          nodes,
		PluginPath:     filepath.Join(binDir, "gpuslice-device-plugin"),
		ExtenderPath:   filepath.Join(binDir, "gpuslice-scheduler"),
		WebhookPath:    filepath.Join(binDir, "gpuslice-webhook"),
		StopWithParent: true,
	}
}

// poll waits for cond with a deadline, failing t with what and the last observation.
func poll(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	last := ""
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, seen := cond(ctx)
		if ctx.Err() == nil { // keep the last real observation, not the deadline's error
			last = seen
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: not within %v (last: %s)", what, timeout, last)
	}
}

// gpuPod returns a pod with one container asking for gpus hami.io/gpu devices.
func gpuPod(name string, gpus int64) *corev1.Pod {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "main",
				Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{cluster.ResourceGPU: q},
				},
			}},
		},
	}
}

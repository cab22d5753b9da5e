package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/vgpu"
)

// draRounds is how many rounds of 60 claims TestDRA places (DRA_ROUNDS, default 10).
func draRounds(t *testing.T) int {
	if v := os.Getenv("DRA_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("DRA_ROUNDS=%q: want a whole number above 0", v)
		}
		return n
	}
	return 10
}

// TestDRA runs gpuslice in DRA mode on two nodes of eight fake 80 GB GPUs: the driver publishes
// its ResourceSlice within 10 s, the stock kube-scheduler allocates native claims with capacity
// requests, and every container's environment, as the runtime resolved the driver's CDI spec at
// CreateContainer, matches its claim's allocation, with no GPU over-committed.
func TestDRA(t *testing.T) {
	opts := clusterOptions(
		cluster.NodeOptions{Name: "dra-1", FakeGPUs: "8xA100-80GB", DRA: true, NoPlugin: true},
		cluster.NodeOptions{Name: "dra-2", FakeGPUs: "8xA100-80GB", DRA: true, NoPlugin: true},
	)
	opts.ControllerManager = true
	c := startClusterWith(t, opts)
	ctx := context.Background()
	for _, n := range c.Nodes {
		began := time.Now()
		if err := n.StartPlugin(); err != nil {
			t.Fatal(err)
		}
		if err := n.WaitPluginReady(ctx); err != nil {
			t.Fatal(err)
		}
		took := time.Since(began)
		t.Logf("FIGURE dra publish %s: ResourceSlice with devices %v after the driver started", n.Name, took.Round(time.Millisecond))
		if took > 10*time.Second {
			t.Errorf("%s: ResourceSlice published after %v, want within 10s", n.Name, took)
		}
	}
	// The driver's publisher (node/publish, as the device plugin's): the node condition True
	// and a heartbeat in DRA mode, and no ready label, which would make a device-plugin node.
	for _, n := range c.Nodes {
		poll(t, 30*time.Second, n.Name+"'s DRA condition and heartbeat", func(ctx context.Context) (bool, string) {
			node, err := c.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if _, ok := node.Labels[vgpu.LabelGPUReady]; ok {
				t.Fatalf("%s: label %s on a DRA node", n.Name, vgpu.LabelGPUReady)
			}
			cond, _ := vgpu.RegisteredCondition(node)
			lease, err := c.Client().CoordinationV1().Leases(vgpu.DefaultHeartbeatNamespace).Get(ctx, vgpu.HeartbeatLeaseName(n.Name), metav1.GetOptions{})
			if err != nil {
				return false, fmt.Sprintf("condition %s/%s, lease: %v", cond.Status, cond.Reason, err)
			}
			h, err := vgpu.ParsePluginHeartbeat(lease.Annotations[vgpu.AnnotationPluginHeartbeat])
			return err == nil && cond.Status == corev1.ConditionTrue && h.Mode == vgpu.NodeModeDRA && h.Registered,
				fmt.Sprintf("condition %s/%s %q, heartbeat %+v %v", cond.Status, cond.Reason, cond.Message, h, err)
		})
	}
	createDeviceClass(t, c)

	t.Run("one claim", func(t *testing.T) {
		tmpl := createClaimTemplate(t, c, 10240, 30)
		began := time.Now()
		createAll(t, c, []*corev1.Pod{claimPod("one", tmpl)})
		out := waitSettled(t, c, "one", 1, time.Minute)
		if len(out.running) != 1 {
			t.Fatalf("pod one not Running: %+v", out.pending)
		}
		t.Logf("FIGURE dra first claim Running after %v", time.Since(began).Round(time.Millisecond))
		mism, over := checkDRA(t, c, out.running)
		if len(mism)+len(over) > 0 {
			t.Fatalf("mismatches %v, over-commits %v", mism, over)
		}
		records, err := c.LatestRecords()
		if err != nil {
			t.Fatal(err)
		}
		r := records[cluster.RecordKey(out.running[0].UID, "main")]
		if r.Env["CUDA_DEVICE_MEMORY_LIMIT_0"] != "10240m" || r.Env["CUDA_DEVICE_SM_LIMIT"] != "30" || r.Env["GPUSLICE_POD"] != "default/one" {
			t.Errorf("env %v, want the slice's limits 10240m and 30 and GPUSLICE_POD default/one", r.Env)
		}
		deleteAll(t, c)
	})

	t.Run("claim shared by two containers", func(t *testing.T) {
		tmpl := createClaimTemplate(t, c, 4096, 0)
		createAll(t, c, []*corev1.Pod{claimPod("shared", tmpl, "a", "b")})
		out := waitSettled(t, c, "shared", 1, time.Minute)
		if len(out.running) != 1 {
			t.Fatalf("pod shared not Running: %+v", out.pending)
		}
		mism, over := checkDRA(t, c, out.running)
		if len(mism)+len(over) > 0 {
			t.Fatalf("mismatches %v, over-commits %v", mism, over)
		}
		deleteAll(t, c)
	})

	t.Run("60 claims of six sizes", func(t *testing.T) {
		sizes := [][2]int64{{4096, 10}, {8192, 0}, {10240, 20}, {16384, 25}, {20480, 0}, {40960, 40}}
		var templates []string
		for _, s := range sizes {
			templates = append(templates, createClaimTemplate(t, c, s[0], s[1]))
		}
		rounds := draRounds(t)
		total := 0
		for round := range rounds {
			rng := rand.New(rand.NewPCG(uint64(round), 14))
			var pods []*corev1.Pod
			for i := range 60 {
				pods = append(pods, claimPod(fmt.Sprintf("r%d-p%02d", round, i), templates[i%len(templates)]))
			}
			rng.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
			began := time.Now()
			createAll(t, c, pods)
			out := waitSettled(t, c, fmt.Sprintf("r%d-", round), 60, 3*time.Minute)
			mism, over := checkDRA(t, c, out.running)
			t.Logf("FIGURE dra round %d: %d running, %d pending, %d mismatches, %d over-commits, settled in %v", round, len(out.running), len(out.pending), len(mism), len(over), time.Since(began).Round(time.Millisecond))
			if len(out.running) != 60 {
				t.Errorf("round %d: %d of 60 pods Running (the 60 slices fit: 980 GiB of 1280)", round, len(out.running))
			}
			if len(mism)+len(over) > 0 {
				t.Fatalf("round %d: mismatches %v, over-commits %v", round, mism, over)
			}
			total += len(out.running)
			deleteAll(t, c)
		}
		t.Logf("FIGURE dra 60 claims x %d rounds: %d containers checked, 0 mismatches, 0 over-commits", rounds, total)
	})

	t.Run("kubelet and driver restarts keep running pods", func(t *testing.T) {
		tmpl := claimTemplateName(10240, 20)
		createAll(t, c, []*corev1.Pod{claimPod("keep-1", tmpl), claimPod("keep-2", tmpl)})
		out := waitSettled(t, c, "keep-", 2, time.Minute)
		if len(out.running) != 2 {
			t.Fatalf("%d of 2 pods Running", len(out.running))
		}
		for _, n := range c.Nodes {
			if err := n.KillPlugin(); err != nil {
				t.Fatal(err)
			}
			if err := n.StartPlugin(); err != nil {
				t.Fatal(err)
			}
			if err := n.WaitPluginReady(ctx); err != nil {
				t.Fatal(err)
			}
			if err := n.StopKubelet(); err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			if err := n.StartKubelet(ctx); err != nil {
				t.Fatal(err)
			}
			// The kubelet deletes its node's ResourceSlices when it starts; the driver's
			// ResourceSlice controller puts them back.
			if err := n.WaitPluginReady(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("FIGURE dra kubelet restart %s: ResourceSlice back %v after the kubelet started", n.Name, time.Since(began).Round(time.Millisecond))
		}
		// A new claim after both restarts is prepared by the restarted driver.
		createAll(t, c, []*corev1.Pod{claimPod("keep-3", tmpl)})
		out = waitSettled(t, c, "keep-", 3, 2*time.Minute)
		if len(out.running) != 3 {
			t.Fatalf("%d of 3 pods Running after the restarts", len(out.running))
		}
		pods, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			for _, s := range p.Status.ContainerStatuses {
				if s.RestartCount > 0 {
					t.Errorf("%s/%s restarted %d times", p.Name, s.Name, s.RestartCount)
				}
			}
		}
		mism, over := checkDRA(t, c, out.running)
		if len(mism)+len(over) > 0 {
			t.Fatalf("mismatches %v, over-commits %v", mism, over)
		}
		deleteAll(t, c)
	})
}

// TestDRAFault: a GPU that falls off the bus is tainted in the ResourceSlice, so no new claim is
// allocated on it while the pods already there keep running; after a reset the taint goes and the
// claim that did not fit runs.
func TestDRAFault(t *testing.T) {
	opts := clusterOptions(cluster.NodeOptions{Name: "dra-1", FakeGPUs: "2xA100-80GB", DRA: true})
	opts.ControllerManager = true
	c := startClusterWith(t, opts)
	n := c.Nodes[0]
	ctx := context.Background()
	createDeviceClass(t, c)
	whole := createClaimTemplate(t, c, 0, 0)
	small := createClaimTemplate(t, c, 1024, 0)
	createAll(t, c, []*corev1.Pod{claimPod("before", small)})
	waitSettled(t, c, "before", 1, time.Minute)

	if _, err := nvidia.WriteFakeFault(n.FaultsDir(), nvidia.FakeFault{GPU: 0, XID: 79}); err != nil {
		t.Fatal(err)
	}
	tainted := func(want bool) func(ctx context.Context) (bool, string) {
		return func(ctx context.Context) (bool, string) {
			slices, err := n.ResourceSlices(ctx)
			if err != nil {
				return false, err.Error()
			}
			for _, s := range slices {
				for _, d := range s.Spec.Devices {
					if d.Name == "gpu-0" {
						return (len(d.Taints) > 0) == want, fmt.Sprintf("taints %v", d.Taints)
					}
				}
			}
			return false, "no device gpu-0"
		}
	}
	poll(t, 30*time.Second, "gpu-0 tainted after XID 79", tainted(true))

	createAll(t, c, []*corev1.Pod{claimPod("whole-1", whole), claimPod("whole-2", whole)})
	out := waitSettled(t, c, "whole-", 2, time.Minute)
	if len(out.running) != 1 || len(out.pending) != 1 {
		t.Fatalf("%d running, %d pending; want one whole GPU left (gpu-1), one pod Pending", len(out.running), len(out.pending))
	}
	mism, over := checkDRA(t, c, out.running)
	if len(mism)+len(over) > 0 {
		t.Fatalf("mismatches %v, over-commits %v", mism, over)
	}
	if before, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "before", metav1.GetOptions{}); err != nil || before.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod before on the failed GPU: %v, err %v; want it Running", before.Status.Phase, err)
	}

	if _, err := nvidia.WriteFakeFault(n.FaultsDir(), nvidia.FakeFault{GPU: 0, Reset: true}); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "gpu-0 untainted after the reset", tainted(false))
	if err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Delete(ctx, "before", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	poll(t, 2*time.Minute, "both whole-GPU pods Running after the recovery", func(ctx context.Context) (bool, string) {
		p, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, out.pending[0].Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase)
	})
}

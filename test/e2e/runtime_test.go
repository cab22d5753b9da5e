package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/test/cluster"
	"github.com/gpuslice/gpuslice/test/fakecri"
	"github.com/gpuslice/gpuslice/test/image"
)

// runtimeImageRepo and runtimeImageTag name the gpuslice image the real-runtime tests build and
// the chart deploys.
const (
	runtimeImageRepo = "localhost/gpuslice/gpuslice"
	runtimeImageTag  = "e2e"
)

// runtimeChartValues: every node labelled gpuslice.io/test-gpu runs the chart's device plugin, as a
// real container of the gpuslice image, with four fake A100s split four ways (16 slices per node,
// as in TestSixtyPodsGetExactlyTheirOwnSlice).
// The NVIDIA CDI folder is the plugin's own, so that nothing is created in the host's /etc.
// kube-scheduler's image is the one buildRuntimeImages makes, with the chart's default tag: the
// cluster's version, which is the binary's.
const runtimeChartValues = `devicePlugin:
  fakeGPUs: 4xA100-80GB
  splitCount: 4
  nvidiaCDISpecDir: /var/run/cdi
  nodeSelector:
    nvidia.com/gpu.present: null
    gpuslice.io/test-gpu: "true"
image:
  repository: ` + runtimeImageRepo + `
  tag: ` + runtimeImageTag + `
  pullPolicy: Never
scheduler:
  kubeScheduler:
    image: ` + image.KubeSchedulerRepo + `
`

// requireRuntime skips t where the real runtime is not installed (hack/install-runtime.sh), or
// fails it when CI=true, and returns the runtime's folder.
func requireRuntime(t *testing.T) string {
	t.Helper()
	requireHost(t)
	dir, err := cluster.FindRuntimeDir()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("e2e: %v (CI=true: not skipping)", err)
		}
		t.Skipf("e2e: %v", err)
	}
	return dir
}

// buildRuntimeImages builds the gpuslice image from the binaries TestMain built, the pause and
// shell images, and the kube-scheduler image from the cluster's kube-scheduler, with make image's
// recipe (test/cmd/gpuslice-image, run as its own process: under -race the compression takes
// minutes), into a folder of the test.
func buildRuntimeImages(t *testing.T) image.Archives {
	t.Helper()
	began := time.Now()
	clusterBin, err := cluster.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pause := filepath.Join(dir, "gpuslice-pause")
	tool := filepath.Join(dir, "gpuslice-image")
	for _, b := range [][]string{{pause, "../cmd/gpuslice-pause"}, {tool, "../cmd/gpuslice-image"}} {
		build := exec.Command("go", "build", "-trimpath", "-o", b[0], b[1]) //nolint:gosec // G204: this module's commands
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b[1], err, out)
		}
	}
	cmd := exec.Command(tool, "--bin-dir", binDir, "--pause", pause, "--name", runtimeImageRepo+":"+runtimeImageTag, "--version", "e2e", //nolint:gosec // G204: the tool just built
		"--kube-scheduler", filepath.Join(clusterBin, "kube-scheduler"), "--out", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gpuslice-image: %v\n%s", err, out)
	}
	t.Logf("images built in %v", time.Since(began).Round(time.Millisecond))
	return image.Archives{
		Gpuslice:      filepath.Join(dir, "gpuslice.tar"),
		Test:          filepath.Join(dir, "test-images.tar"),
		KubeScheduler: filepath.Join(dir, "kube-scheduler.tar"),
	}
}

// shellSlicePod is slicePod with a container of the shell image that prints its environment and
// mounts (cluster.PrintEnvAndMounts), for a real runtime.
func shellSlicePod(name string, memMiB int64) *corev1.Pod {
	p := slicePod(name, memMiB, 0)
	p.Spec.Containers[0].Image = image.ShellName
	p.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
	p.Spec.Containers[0].Command = []string{"/bin/sh", "-c", cluster.PrintEnvAndMounts}
	return p
}

// runtimePods is how many GPU pods TestRealRuntimeSharing creates at once (32 slices between its
// two nodes): 40 in make test, which keeps the real-runtime scenario near a minute;
// GPUSLICE_RUNTIME_PODS overrides it (make e2e-runtime: 60, as the fake-runtime sharing proof).
func runtimePods(t *testing.T) int {
	if v := os.Getenv("GPUSLICE_RUNTIME_PODS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GPUSLICE_RUNTIME_PODS=%q: want a positive integer", v)
		}
		return n
	}
	return 40
}

// TestRealRuntimeSharing is the sharing proof on real containers: two nodes run containerd and
// runc; helm installs the chart, whose workloads all run as containers on them: the
// device-plugin DaemonSet's pods, the scheduler Deployment's pod (the extender of the gpuslice
// image and kube-scheduler of an image of the cluster's own binary) and the webhook Deployment's
// pod, all from images built by make image's recipe; GPU pods of the shell image print what they
// got. containerd itself resolves the CDI device the plugin wrote at container start: every
// Running container's environment equals its own pod's allocation and every mount of its CDI
// spec is in its mount table; no GPU holds more than its memory or slices; pods that do not fit
// stay Pending naming memory or slices. Then a GPU container is killed and restarted by the
// kubelet (the cached Allocate answer and a new PreStartContainer give it the same slice); the
// plugin's container is killed and restarted, registers again and serves a new pod; the
// extender's container is killed and restarted, and a new pod gets its own slice with no GPU
// over capacity; and a kubelet is restarted: the plugin re-registers, the running containers,
// the control plane's included, are left alone and a new pod gets its own slice. Real: every
// Kubernetes component, containerd, runc, the chart, the images. Fake: NVML. Not as the chart
// has it: one replica of each Deployment, bound to a node by the harness, in the nodes' (this
// host's) network, with the webhook Service's EndpointSlice written by the harness (see
// docs/development.md).
func TestRealRuntimeSharing(t *testing.T) {
	rtDir := requireRuntime(t)
	archives := buildRuntimeImages(t)
	labels := map[string]string{"gpuslice.io/test-gpu": "true"}
	opts := clusterOptions(
		cluster.NodeOptions{Name: "node-1", Labels: labels},
		cluster.NodeOptions{Name: "node-2", Labels: labels},
	)
	opts.Runtime = &cluster.RuntimeOptions{Dir: rtDir, Images: []string{archives.Gpuslice, archives.Test, archives.KubeScheduler}}
	opts.Chart = &cluster.ChartOptions{Dir: chartDir(t), ValuesFiles: []string{valuesFile(t, runtimeChartValues)}}
	began := time.Now()
	c := startClusterWith(t, opts)
	ctx := context.Background()

	// Every workload of the chart runs as containerd containers of the images built above: the
	// device plugins, the extender and the webhook of the gpuslice image, kube-scheduler of the
	// image the chart names by the cluster's version.
	gpuslice := runtimeImageRepo + ":" + runtimeImageTag
	for _, n := range c.Nodes {
		checkContainers(t, c, n.PluginPod, map[string]string{"device-plugin": gpuslice})
	}
	version, err := c.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	checkContainers(t, c, c.State.SchedulerPod, map[string]string{"kube-scheduler": image.KubeSchedulerRepo + ":" + version.GitVersion, "extender": gpuslice})
	checkContainers(t, c, c.State.WebhookPod, map[string]string{"webhook": gpuslice})

	sizes := []int64{4096, 8192, 12288, 16384, 24576, 40960}
	var pods []*corev1.Pod
	for i := range runtimePods(t) {
		pods = append(pods, shellSlicePod(fmt.Sprintf("rt-%02d", i), sizes[i%len(sizes)]))
	}
	burst := time.Now()
	createAll(t, c, pods)
	out := waitSettled(t, c, "rt-", len(pods), 4*time.Minute)
	waitReports(t, c, out.running)
	t.Logf("%d pods: %d Running, %d Pending in %v; %s", len(pods), len(out.running), len(out.pending), time.Since(burst).Round(time.Millisecond), unresolvedStarts(ctx, t, c))
	if len(out.running) == 0 {
		t.Fatal("no pod is Running")
	}
	for _, b := range append(checkExact(t, c, out.running), checkCapacity(t, c, out.running)...) {
		t.Error(b)
	}
	for _, b := range cdiMountMismatches(t, c, out.running) {
		t.Error(b)
	}
	failed, err := failedScheduling(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range out.pending {
		if msg := failed[p.UID]; !strings.Contains(msg, "memory") && !strings.Contains(msg, "slice") {
			t.Errorf("%s Pending: FailedScheduling %q names neither memory nor slices", p.Name, msg)
		}
	}

	// The Pending pods have made their point; gone, they take no slice freed below.
	for _, p := range out.pending {
		deletePod(t, c, p)
	}

	// A container restart: the kubelet replays the cached Allocate answer, the plugin's
	// PreStartContainer writes the CDI spec again, containerd resolves it again.
	restartAndCheck(t, c, out.running[0], "after the container restart")

	// A restart of the plugin's own container: it registers again and serves a new pod.
	pluginNode := c.Nodes[1]
	pluginPod, err := c.Client().CoreV1().Pods("gpuslice-system").Get(ctx, pluginNode.PluginPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	registered := registrations(t, pluginNode)
	killContainer(t, c, pluginPod, "device-plugin")
	waitRestarted(t, c, pluginPod.Name, "device-plugin")
	poll(t, time.Minute, pluginNode.Name+"'s restarted plugin registered", func(context.Context) (bool, string) {
		got := registrations(t, pluginNode)
		return got > registered, fmt.Sprintf("%d registrations, %d before the restart", got, registered)
	})
	waitDevices(t, c, pluginNode, time.Now())
	// A container allocated before the plugin's restart starts again under the CDI device name
	// its Allocate gave it, which the restarted plugin read back from its checkpoint.
	for _, p := range out.running {
		if p.Spec.NodeName == pluginNode.Name {
			restartAndCheck(t, c, p, "after the plugin's restart, a container restart")
			break
		}
	}
	runFreshPod(t, c, pluginNode, "rt-after-plugin-restart", out)

	// A restart of the extender's container beside kube-scheduler: it reads the bound pods'
	// allocations again, and a new pod gets its own slice, no GPU over its memory or slices.
	schedPod, err := c.Client().CoreV1().Pods("gpuslice-system").Get(ctx, c.State.SchedulerPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	killContainer(t, c, schedPod, "extender")
	waitRestarted(t, c, schedPod.Name, "extender")
	runFreshPod(t, c, c.Nodes[0], "rt-after-extender-restart", out)
	for _, b := range checkCapacity(t, c, runningPods(t, c)) {
		t.Errorf("after the extender restart: %s", b)
	}

	// A kubelet restart: the plugin, in its container, re-registers; nothing running restarts.
	n := c.Nodes[0]
	before := restartCounts(t, c)
	controlPlane := controlPlaneRestarts(t, c)
	registered = registrations(t, n)
	if err := n.KillKubelet(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := n.StartKubelet(rctx); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, n.Name+"'s plugin registered with the new kubelet", func(context.Context) (bool, string) {
		got := registrations(t, n)
		return got > registered, fmt.Sprintf("%d registrations, %d before the restart", got, registered)
	})
	waitDevices(t, c, n, time.Now())
	runFreshPod(t, c, n, "rt-after-kubelet-restart", out)
	for name, restarts := range restartCounts(t, c) {
		if want, ok := before[name]; ok && restarts != want {
			t.Errorf("%s: %d restarts after the kubelet restart, want %d", name, restarts, want)
		}
	}
	if diff := cmp.Diff(controlPlane, controlPlaneRestarts(t, c)); diff != "" {
		t.Errorf("control-plane container restarts across the kubelet restart (-before +after):\n%s", diff)
	}
	t.Logf("real-runtime scenario in %v", time.Since(began).Round(time.Millisecond))
}

// unresolvedStarts says how many container starts in the default namespace the runtime
// (containerd, or the fake runtime with NodeOptions.CDIOnNotify) failed because a CDI device did
// not resolve: its CDI cache, refreshed when inotify reports a change to the spec folder, had not
// yet read the spec the device plugin wrote at PreStartContainer. The kubelet retries such a
// start. Reported, not asserted: it depends on the machine's load.
func unresolvedStarts(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	events, err := c.Client().CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "reason=Failed"})
	if err != nil {
		return "events not read: " + err.Error()
	}
	var n int32
	for _, e := range events.Items {
		if strings.Contains(e.Message, "unresolvable CDI devices") {
			n += max(e.Count, 1)
		}
	}
	return fmt.Sprintf("%d container starts failed on an unresolvable CDI device and were retried", n)
}

// restartAndCheck kills victim's main container, waits until the runtime has run it again and
// it has reported, and checks that it got exactly its own slice again.
func restartAndCheck(t *testing.T, c *cluster.Cluster, victim corev1.Pod, when string) {
	t.Helper()
	killContainer(t, c, &victim, "main")
	poll(t, time.Minute, victim.Name+" restarted and reported again", func(ctx context.Context) (bool, string) {
		p, err := c.Client().CoreV1().Pods(victim.Namespace).Get(ctx, victim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		records, err := c.LatestRecords()
		if err != nil {
			return false, err.Error()
		}
		r := records[cluster.RecordKey(p.UID, "main")]
		restarts := p.Status.ContainerStatuses[0].RestartCount
		return restarts > victim.Status.ContainerStatuses[0].RestartCount && int64(r.Attempt) >= int64(restarts), fmt.Sprintf("restarts %d, latest report attempt %d", restarts, r.Attempt)
	})
	bad := checkExact(t, c, []corev1.Pod{victim})
	for _, b := range bad {
		t.Errorf("%s: %s", when, b)
	}
	t.Logf("%s: %s on %s ran again, %d mismatches", when, victim.Name, victim.Spec.NodeName, len(bad))
}

// runFreshPod deletes one running pod of out on n (not the first, whose restarts the test counts)
// and runs a new GPU pod named name there, which must get exactly its own slice.
func runFreshPod(t *testing.T, c *cluster.Cluster, n *cluster.Node, name string, out podOutcome) {
	t.Helper()
	for _, p := range out.running[1:] {
		if p.Spec.NodeName == n.Name && deletePod(t, c, p) {
			break
		}
	}
	fresh := shellSlicePod(name, 4096)
	fresh.Spec.NodeSelector = map[string]string{corev1.LabelHostname: n.Name}
	createAll(t, c, []*corev1.Pod{fresh})
	var got corev1.Pod
	// Not waitSettled: a filter verdict given before the freed slice reached the extender is
	// retried by the scheduler, so only Running (or Failed) ends the wait.
	poll(t, 2*time.Minute, name+" Running on "+n.Name, func(ctx context.Context) (bool, string) {
		p, err := c.Client().CoreV1().Pods(fresh.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("%s Failed on %s: %s: %s", name, p.Spec.NodeName, p.Status.Reason, p.Status.Message)
		}
		got = *p
		return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase) + "@" + p.Spec.NodeName
	})
	running := []corev1.Pod{got}
	waitReports(t, c, running)
	for _, b := range checkExact(t, c, running) {
		t.Errorf("%s: %s", name, b)
	}
}

// deletePod deletes p at once and waits until it is gone; false when it was gone already.
func deletePod(t *testing.T, c *cluster.Cluster, p corev1.Pod) bool {
	t.Helper()
	pods := c.Client().CoreV1().Pods(p.Namespace)
	err := pods.Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, p.Name+" deleted", func(ctx context.Context) (bool, string) {
		_, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	return true
}

// runtimeDevices is the hami.io/gpu count of each node of TestRealRuntimeSharing: 4 GPUs, 4 slices.
const runtimeDevices = 16

// waitDevices waits until n's Node reports, in a status newer than since (whole seconds on the
// wire), all runtimeDevices allocatable: the kubelet then admits GPU pods again. A registration
// alone is not enough: the kubelet learns the devices from ListAndWatch after Register returns,
// and an older status still shows the devices of before the restart.
func waitDevices(t *testing.T, c *cluster.Cluster, n *cluster.Node, since time.Time) {
	t.Helper()
	poll(t, time.Minute, n.Name+" reporting its devices again", func(ctx context.Context) (bool, string) {
		node, err := c.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var beat time.Time
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				beat = cond.LastHeartbeatTime.Time
			}
		}
		q := node.Status.Allocatable[cluster.ResourceGPU]
		return beat.After(since.Add(time.Second)) && q.Value() == runtimeDevices, fmt.Sprintf("allocatable %s, Ready heartbeat %v", q.String(), beat)
	})
}

// registrations counts the plugin's "Registered with kubelet" log lines in every log of n's
// plugin container (one file per container start).
func registrations(t *testing.T, n *cluster.Node) int {
	t.Helper()
	logs, err := filepath.Glob(filepath.Join(n.Dir, "log", "pods", "gpuslice-system_"+n.PluginPod+"_*", "device-plugin", "*.log"))
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, l := range logs {
		b, err := os.ReadFile(l) //nolint:gosec // G304: a container log of the test's cluster
		if err != nil {
			t.Fatal(err)
		}
		count += strings.Count(string(b), `"Registered with kubelet"`)
	}
	return count
}

// waitReports waits until every container of pods has printed its report (the pods are Running;
// their log may lag a moment).
func waitReports(t *testing.T, c *cluster.Cluster, pods []corev1.Pod) {
	t.Helper()
	poll(t, time.Minute, "a report of every running container", func(context.Context) (bool, string) {
		records, err := c.LatestRecords()
		if err != nil {
			return false, err.Error()
		}
		missing := 0
		for _, p := range pods {
			if _, ok := records[cluster.RecordKey(p.UID, "main")]; !ok {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d missing", missing, len(pods))
	})
}

// cdiMountMismatches returns one line per mount of a running container's CDI spec (the plugin's
// spec whose environment names that pod and container) that is missing from the mount table the
// container printed, and one per container for which no spec is found.
func cdiMountMismatches(t *testing.T, c *cluster.Cluster, pods []corev1.Pod) []string {
	t.Helper()
	records, err := c.LatestRecords()
	if err != nil {
		t.Fatal(err)
	}
	specs := map[string][]string{} // RecordKey -> container paths of the spec's mounts
	for _, n := range c.Nodes {
		files, err := filepath.Glob(filepath.Join(n.CDISpecDir(), "gpuslice.io-vgpu_*.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			var spec struct {
				Devices []struct {
					ContainerEdits struct {
						Env    []string `json:"env"`
						Mounts []struct {
							ContainerPath string `json:"containerPath"`
						} `json:"mounts"`
					} `json:"containerEdits"`
				} `json:"devices"`
			}
			b, err := os.ReadFile(f) //nolint:gosec // G304: a spec of the cluster's plugin
			if err != nil || json.Unmarshal(b, &spec) != nil || len(spec.Devices) != 1 {
				continue // replaced or removed meanwhile
			}
			env := map[string]string{}
			for _, kv := range spec.Devices[0].ContainerEdits.Env {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
			var paths []string
			for _, m := range spec.Devices[0].ContainerEdits.Mounts {
				paths = append(paths, m.ContainerPath)
			}
			specs[env["GPUSLICE_POD_UID"]+"/"+env["GPUSLICE_CONTAINER"]] = paths
		}
	}
	var bad []string
	for _, p := range pods {
		key := cluster.RecordKey(p.UID, "main")
		paths, ok := specs[key]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: no CDI spec of the plugin names it", p.Name))
			continue
		}
		for _, want := range paths {
			if !hasMount(records[key], want) {
				bad = append(bad, fmt.Sprintf("%s: the CDI spec's mount %s is not in the container's mount table", p.Name, want))
			}
		}
	}
	return bad
}

// hasMount reports whether r's mount table has a mount at path.
func hasMount(r fakecri.Record, path string) bool {
	for _, m := range r.Mounts {
		if m.ContainerPath == path {
			return true
		}
	}
	return false
}

// killContainer kills the process of p's container name with SIGKILL, as an out-of-memory kill
// or a crash would, through runc's record of it; p is updated to the pod as it was before.
func killContainer(t *testing.T, c *cluster.Cluster, p *corev1.Pod, name string) {
	t.Helper()
	cur, err := c.Client().CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	*p = *cur
	st, ok := containerStatus(p, name)
	if !ok {
		t.Fatalf("pod %s has no status of container %s", p.Name, name)
	}
	pid, err := c.ContainerPID(p.Spec.NodeName, st.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill container %s of %s (pid %d): %v", name, p.Name, pid, err)
	}
}

// containerStatus returns the status of p's container name.
func containerStatus(p *corev1.Pod, name string) (corev1.ContainerStatus, bool) {
	for _, st := range p.Status.ContainerStatuses {
		if st.Name == name {
			return st, true
		}
	}
	return corev1.ContainerStatus{}, false
}

// waitRestarted waits until container name of pod (in gpuslice-system) has restarted and is
// Ready again by its readiness probe.
func waitRestarted(t *testing.T, c *cluster.Cluster, pod, name string) {
	t.Helper()
	poll(t, 2*time.Minute, pod+"/"+name+" restarted and Ready", func(ctx context.Context) (bool, string) {
		p, err := c.Client().CoreV1().Pods("gpuslice-system").Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st, _ := containerStatus(p, name)
		return st.RestartCount >= 1 && st.Ready, fmt.Sprintf("restarts %d, ready %t", st.RestartCount, st.Ready)
	})
}

// checkContainers checks that pod (in gpuslice-system) runs exactly the containers of want, each
// a Ready containerd container of its image.
func checkContainers(t *testing.T, c *cluster.Cluster, pod string, want map[string]string) {
	t.Helper()
	p, err := c.Client().CoreV1().Pods("gpuslice-system").Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod %q: %v", pod, err)
	}
	got := map[string]string{}
	for _, st := range p.Status.ContainerStatuses {
		runtime, _, _ := strings.Cut(st.ContainerID, "://")
		got[st.Name] = fmt.Sprintf("%s ready=%t %s", runtime, st.Ready, st.Image)
	}
	wantStatus := map[string]string{}
	for name, img := range want {
		wantStatus[name] = "containerd ready=true " + img
	}
	if diff := cmp.Diff(wantStatus, got); diff != "" {
		t.Errorf("pod %s on %s: containers (-want +got):\n%s", p.Name, p.Spec.NodeName, diff)
	}
}

// controlPlaneRestarts returns the restart count of every container of the chart's scheduler and
// webhook pods, by pod/container.
func controlPlaneRestarts(t *testing.T, c *cluster.Cluster) map[string]int32 {
	t.Helper()
	out := map[string]int32{}
	for _, name := range []string{c.State.SchedulerPod, c.State.WebhookPod} {
		p, err := c.Client().CoreV1().Pods("gpuslice-system").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range p.Status.ContainerStatuses {
			out[name+"/"+st.Name] = st.RestartCount
		}
	}
	return out
}

// runningPods returns the Running pods of the default namespace.
func runningPods(t *testing.T, c *cluster.Cluster) []corev1.Pod {
	t.Helper()
	list, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning {
			out = append(out, p)
		}
	}
	return out
}

// restartCounts returns the restart count of container main of every pod of the default namespace.
func restartCounts(t *testing.T, c *cluster.Cluster) map[string]int32 {
	t.Helper()
	list, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int32{}
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) > 0 {
			out[p.Name] = p.Status.ContainerStatuses[0].RestartCount
		}
	}
	return out
}

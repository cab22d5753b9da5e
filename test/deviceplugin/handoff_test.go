package deviceplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/deviceplugin/clientset"
	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/test/harness/devicemanager"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// handoffEnv is the bind → Allocate hand-off on a real kubelet device
// manager serving the kubelet's own PodResources API, with pods in
// client-go's fake clientset as the scheduler extender leaves them: bound to
// the node, with their allocation annotation.
type handoffEnv struct {
	t      *testing.T
	mode   deviceplugin.Mode
	dir    string
	socket string // PodResources
	m      *devicemanager.Manager
	client *fake.Clientset
}

func newHandoffEnv(t *testing.T, mode deviceplugin.Mode) *handoffEnv {
	t.Helper()
	short, err := os.MkdirTemp("", "pr") // unix socket paths are limited to 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(short) })
	h := &handoffEnv{t: t, mode: mode, dir: t.TempDir(), socket: filepath.Join(short, "kubelet.sock"), client: fake.NewClientset()}
	h.m = devicemanager.Start(t, h.dir)
	h.m.ServePodResources(t, h.socket)
	return h
}

// start runs a plugin and waits until the kubelet has all its devices.
func (h *handoffEnv) start() *runningPlugin {
	h.t.Helper()
	return h.startWith(nil)
}

// startWith is start with configuration changes.
func (h *handoffEnv) startWith(mutate func(*deviceplugin.Config)) *runningPlugin {
	h.t.Helper()
	p := startPluginWith(h.t, h.dir, clientset.New(h.client), func(c *deviceplugin.Config) {
		c.Mode = h.mode
		c.PodResourcesSocket = h.socket
		if mutate != nil {
			mutate(c)
		}
	})
	if err := h.m.WaitResource(waitCtx(h.t, waitLong), resourceName, allDevices, allDevices); err != nil {
		h.t.Fatal(err)
	}
	return p
}

// fakeGPU is the UUID of fake GPU i of the node.
func fakeGPU(i int) string { return nvidia.FakeUUID(nodeName, i) }

// createPod creates a pod bound to the node with one app container per
// allocation entry, each asking for as many hami.io/gpu as it has slices.
func (h *handoffEnv) createPod(name string, created time.Time, alloc *vgputest.AllocationBuilder) *corev1.Pod {
	h.t.Helper()
	a := alloc.Obj()
	value, err := vgpu.EncodePodAllocation(a)
	if err != nil {
		h.t.Fatal(err)
	}
	b := vgputest.Pod(name).NodeName(nodeName).Annotation(vgpu.AnnotationPodAllocation, value)
	for _, c := range a.Containers {
		b.Container(c.Name).GPU(len(c.GPUs))
	}
	pod := b.Obj()
	pod.CreationTimestamp = metav1.NewTime(created)
	if _, err := h.client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	return pod
}

// startContainer does what the kubelet does before CreateContainer (device
// options, PreStartContainer) and returns the container's environment as
// the runtime would build it: the Allocate answer's env, plus in mode cdi
// the env of its CDI device, resolved from the plugin's spec folder by the
// CDI library.
func (h *handoffEnv) startContainer(pod *corev1.Pod, container string) map[string]string {
	h.t.Helper()
	opts, err := h.m.RunContainerOptions(pod, containerOf(pod, container))
	if err != nil {
		h.t.Fatalf("start %s/%s: %v", pod.Name, container, err)
	}
	env := map[string]string{}
	for _, e := range opts.Envs {
		env[e.Name] = e.Value
	}
	if h.mode == deviceplugin.ModeEnv {
		if len(opts.CDIDevices) != 0 {
			h.t.Errorf("mode env gave CDI devices %v", opts.CDIDevices)
		}
		return env
	}
	if len(opts.CDIDevices) != 1 || len(opts.Envs) != 0 {
		h.t.Fatalf("mode cdi: CDI devices %v and env %v, want one CDI device and no env", opts.CDIDevices, opts.Envs)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(filepath.Join(h.dir, "cdi")), cdi.WithAutoRefresh(false))
	if err != nil {
		h.t.Fatalf("CDI cache: %v", err)
	}
	injected, err := injectEnv(cache.InjectDevices, opts.CDIDevices[0].Name)
	if err != nil {
		h.t.Fatalf("resolve %s: %v", opts.CDIDevices[0].Name, err)
	}
	for _, kv := range injected {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	env["cdiDevice"] = opts.CDIDevices[0].Name
	return env
}

// waitPrepared waits until a spec in the plugin's CDI spec folder names
// pod: the plugin prepares the spec of the container the kubelet admitted
// at Allocate, in the background, before the container's start.
func (h *handoffEnv) waitPrepared(pod string) {
	h.t.Helper()
	waitUntil(h.t, waitLong, "a CDI spec prepared at Allocate for pod "+pod, func() bool {
		specs, err := filepath.Glob(filepath.Join(h.dir, "cdi", "*.json"))
		if err != nil {
			return false
		}
		for _, file := range specs {
			data, err := os.ReadFile(file) //nolint:gosec // G304: the test's own folder.
			if err == nil && strings.Contains(string(data), handoff.EnvPod+"=default/"+pod+`"`) {
				return true
			}
		}
		return false
	})
}

// injectEnv injects devices into an empty OCI spec and returns its env. The
// OCI type is inferred from inject, so the test needs no direct import of
// the runtime-spec module.
func injectEnv[S any](inject func(*S, ...string) ([]string, error), devices ...string) ([]string, error) {
	var spec S
	if _, err := inject(&spec, devices...); err != nil {
		return nil, err
	}
	data, err := json.Marshal(&spec)
	if err != nil {
		return nil, err
	}
	var r struct {
		Process struct {
			Env []string `json:"env"`
		} `json:"process"`
	}
	err = json.Unmarshal(data, &r)
	return r.Process.Env, err
}

func containerOf(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return nil
}

// heldGPUs returns the GPUs behind the devices the kubelet gave a
// container, read through the kubelet's PodResources API, sorted.
func (h *handoffEnv) heldGPUs(pod *corev1.Pod, container string) []string {
	h.t.Helper()
	conn, err := grpc.NewClient("unix://"+h.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		h.t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(waitCtx(h.t, waitLong), &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		h.t.Fatal(err)
	}
	var gpus []string
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			if p.GetName() != pod.Name || c.GetName() != container {
				continue
			}
			for _, d := range c.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					uuid, _ := deviceplugin.GPUOfDeviceID(id)
					gpus = append(gpus, uuid)
				}
			}
		}
	}
	slices.Sort(gpus)
	return slices.Compact(gpus)
}

// TestHandoffCDI: through the real device manager, each container gets
// its own pod's slice by CDI; the kubelet's devices land on the GPUs the
// scheduler chose; each container's spec is prepared at Allocate, before
// its start; a container restart gets the same; and when a pod's device
// IDs pass to a new pod, the new pod gets its own slice.
func TestHandoffCDI(t *testing.T) {
	t.Parallel()
	h := newHandoffEnv(t, deviceplugin.ModeCDI)
	t0 := time.Now().Add(-time.Hour)
	a := h.createPod("a", t0, vgputest.Allocation(nodeName).Container("main").Slice(fakeGPU(1), 10240, 25))
	b := h.createPod("b", t0.Add(time.Second), vgputest.Allocation(nodeName).Container("main").Slice(fakeGPU(2), 8192, 50).Slice(fakeGPU(0), 20480, 50))
	h.start()

	want := map[string]map[string]string{
		"a": {
			handoff.EnvVisibleDevices: fakeGPU(1), handoff.EnvMemoryLimitPrefix + "0": "10240m", handoff.EnvSMLimit: "25",
			handoff.EnvPod: "default/a", handoff.EnvPodUID: "uid-a", handoff.EnvContainer: "main",
		},
		"b": {
			handoff.EnvVisibleDevices: fakeGPU(2) + "," + fakeGPU(0), handoff.EnvMemoryLimitPrefix + "0": "8192m",
			handoff.EnvMemoryLimitPrefix + "1": "20480m", handoff.EnvSMLimit: "50",
			handoff.EnvPod: "default/b", handoff.EnvPodUID: "uid-b", handoff.EnvContainer: "main",
		},
	}
	wantGPUs := map[string][]string{"a": {fakeGPU(1)}, "b": sorted(fakeGPU(2), fakeGPU(0))}
	cdiNames := map[string]string{}
	for _, pod := range []*corev1.Pod{a, b} {
		if err := h.m.Allocate(pod, &pod.Spec.Containers[0]); err != nil {
			t.Fatalf("kubelet Allocate for %s: %v", pod.Name, err)
		}
		h.waitPrepared(pod.Name)
		for start := 1; start <= 2; start++ { // a container restart replays the cached answer
			env := h.startContainer(pod, "main")
			cdiNames[pod.Name] = env["cdiDevice"]
			if diff := cmp.Diff(want[pod.Name], pick(env, want[pod.Name])); diff != "" {
				t.Errorf("pod %s, start %d: env (-want +got):\n%s", pod.Name, start, diff)
			}
		}
		if diff := cmp.Diff(wantGPUs[pod.Name], h.heldGPUs(pod, "main")); diff != "" {
			t.Errorf("pod %s: GPUs of the kubelet's devices, steered by GetPreferredAllocation (-want +got):\n%s", pod.Name, diff)
		}
	}

	// Pod a ends; pod c is admitted on the same GPU and gets a's device
	// IDs (the lowest free slice), under a CDI device name of its own:
	// the IDs' key, then another token.
	h.m.MarkInactive(a.UID)
	if err := h.client.CoreV1().Pods("default").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c := h.createPod("c", time.Now(), vgputest.Allocation(nodeName).Container("main").Slice(fakeGPU(1), 2048, 0))
	if err := h.m.Allocate(c, &c.Spec.Containers[0]); err != nil {
		t.Fatalf("kubelet Allocate for c: %v", err)
	}
	h.waitPrepared("c")
	env := h.startContainer(c, "main")
	key := func(qualified string) string { k, _, _ := strings.Cut(qualified, "-"); return k }
	if env["cdiDevice"] == cdiNames["a"] || key(env["cdiDevice"]) != key(cdiNames["a"]) {
		t.Errorf("c got CDI device %s, a had %s: want the same device IDs under another name", env["cdiDevice"], cdiNames["a"])
	}
	got := []string{env[handoff.EnvPod], env[handoff.EnvMemoryLimitPrefix+"0"], env[handoff.EnvSMLimit]}
	if diff := cmp.Diff([]string{"default/c", "2048m", ""}, got); diff != "" {
		t.Errorf("c's pod, memory limit, SM limit (-want +got):\n%s", diff)
	}
}

// TestHandoffCDIStartAfterAKillAtAllocate: a plugin killed right after
// Allocate answered, before it wrote the CDI device name it gave to its
// checkpoint (in the background, milliseconds later), still lets the
// container start. The kill is played by stopping the plugin and putting
// its state folder and spec folder back as they were before Allocate, as
// such a kill leaves them (the spec prepared at Allocate is written only
// after that checkpoint). A new plugin is started; the container's start
// through the real device manager, which kept the Allocate answer, resolves
// that name with its own pod's slice.
func TestHandoffCDIStartAfterAKillAtAllocate(t *testing.T) {
	t.Parallel()
	h := newHandoffEnv(t, deviceplugin.ModeCDI)
	a := h.createPod("a", time.Now(), vgputest.Allocation(nodeName).Container("main").Slice(fakeGPU(1), 10240, 25))
	p := h.start()
	checkpoint := filepath.Join(h.dir, "gpuslice-state", "claims.json")
	before, err := os.ReadFile(checkpoint) //nolint:gosec // G304: the test's own folder.
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := h.m.Allocate(a, &a.Spec.Containers[0]); err != nil {
		t.Fatalf("kubelet Allocate for a: %v", err)
	}
	h.waitPrepared("a")
	p.stop()
	if err := h.m.WaitResource(waitCtx(t, waitLong), resourceName, allDevices, 0); err != nil {
		t.Fatalf("plugin stopped: %v", err)
	}
	if before == nil {
		err = os.Remove(checkpoint)
	} else {
		err = os.WriteFile(checkpoint, before, 0o600) //nolint:gosec // G703: the test's own folder.
	}
	if err != nil {
		t.Fatal(err)
	}
	specs, err := filepath.Glob(filepath.Join(h.dir, "cdi", "*.json"))
	if err != nil || len(specs) == 0 {
		t.Fatalf("specs prepared at Allocate: %v, %v", specs, err)
	}
	for _, spec := range specs {
		if err := os.Remove(spec); err != nil {
			t.Fatal(err)
		}
	}

	h.start()
	want := map[string]string{handoff.EnvPod: "default/a", handoff.EnvPodUID: "uid-a", handoff.EnvMemoryLimitPrefix + "0": "10240m"}
	if diff := cmp.Diff(want, pick(h.startContainer(a, "main"), want)); diff != "" {
		t.Errorf("a's env after a kill at Allocate (-want +got):\n%s", diff)
	}
}

// TestHandoffEnv: in mode env a container gets its slice from Allocate,
// a plugin restart keeps it verifiable, and a wrong guess (a younger pod
// admitted before an older one on the same GPU) is refused at start with
// an event, never run with another pod's limits.
func TestHandoffEnv(t *testing.T) {
	t.Parallel()
	h := newHandoffEnv(t, deviceplugin.ModeEnv)
	t0 := time.Now().Add(-time.Hour)
	a := h.createPod("a", t0, vgputest.Allocation(nodeName).Container("main").Slice(fakeGPU(1), 10240, 25))
	p := h.start()
	if err := h.m.Allocate(a, &a.Spec.Containers[0]); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{handoff.EnvVisibleDevices: fakeGPU(1), handoff.EnvMemoryLimitPrefix + "0": "10240m", handoff.EnvPod: "default/a"}
	if diff := cmp.Diff(want, pick(h.startContainer(a, "main"), want)); diff != "" {
		t.Errorf("a's env (-want +got):\n%s", diff)
	}

	p.stop()
	if err := h.m.WaitResource(waitCtx(t, waitLong), resourceName, allDevices, 0); err != nil {
		t.Fatalf("plugin stopped: %v", err)
	}
	h.start()
	if diff := cmp.Diff(want, pick(h.startContainer(a, "main"), want)); diff != "" {
		t.Errorf("a's env after a plugin restart (-want +got):\n%s", diff)
	}

	old := h.createPod("old", t0.Add(time.Second), vgputest.Allocation(nodeName).Container("main").Slice(fakeGPU(0), 1024, 0))
	young := h.createPod("young", t0.Add(2*time.Second), vgputest.Allocation(nodeName).Container("main").Slice(fakeGPU(0), 2048, 0))
	// Both are in the kubelet's pod manager (listed by PodResources), and the
	// younger is admitted first: the plugin guesses the older one. (When only
	// the pod being admitted is listed, the guess is right.)
	h.m.MarkActive(old)
	if err := h.m.Allocate(young, &young.Spec.Containers[0]); err != nil {
		t.Fatal(err)
	}
	_, err := h.m.RunContainerOptions(young, &young.Spec.Containers[0])
	const wantErr = "allocated to default/old/main but started for default/young/main"
	if err == nil || !strings.Contains(err.Error(), wantErr) {
		t.Fatalf("starting young = %v, want an error containing %q", err, wantErr)
	}
	h.waitEvent("young", corev1.EventTypeWarning, deviceplugin.ReasonAllocationMismatch, "")
}

// waitEvent waits until the plugin has recorded an event of type and
// reason on pod, whose message contains message.
func (h *handoffEnv) waitEvent(pod, eventType, reason, message string) {
	h.t.Helper()
	waitUntil(h.t, waitLong, fmt.Sprintf("a %s %s event on pod %s with %q", eventType, reason, pod, message), func() bool {
		events, err := h.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		return slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
			return e.InvolvedObject.Name == pod && e.Reason == reason && e.Type == eventType && strings.Contains(e.Message, message)
		})
	})
}

// pick returns env's values for the keys of want.
func pick(env, want map[string]string) map[string]string {
	got := map[string]string{}
	for k := range want {
		if v, ok := env[k]; ok {
			got[k] = v
		}
	}
	return got
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

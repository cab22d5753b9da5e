package deviceplugin

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/clock"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuslice/gpuslice/deviceplugin/clientset"
	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// The hand-off tests' node: two GPUs with distinct minors, 10 slices each.
const (
	gpuA = "GPU-aaaaaaaa-0000-0000-0000-00000000000a"
	gpuB = "GPU-bbbbbbbb-0000-0000-0000-00000000000b"
)

func handoffGPUs() []vgpu.GPU {
	return []vgpu.GPU{
		{UUID: gpuA, Index: 0, Minor: 3, Model: "NVIDIA A100-SXM4-80GB", TotalMemoryMiB: 81920, NUMANode: 0, Health: vgpu.Healthy},
		{UUID: gpuB, Index: 1, Minor: 7, Model: "NVIDIA A100-SXM4-80GB", TotalMemoryMiB: 81920, NUMANode: -1, Health: vgpu.Healthy},
	}
}

// fakePodResources is a stateful stand-in for the kubelet's PodResources
// API: it lists what tests hold, one entry per device as the kubelet does,
// and can fail the next calls with given codes.
type fakePodResources struct {
	mu       sync.Mutex
	pods     map[string]*podresourcesapi.PodResources // by namespace/name
	failures []codes.Code
	calls    int
	// delay is how long each List takes to answer (a kubelet under load).
	delay time.Duration
}

func newFakePodResources() *fakePodResources {
	return &fakePodResources{pods: map[string]*podresourcesapi.PodResources{}}
}

func (f *fakePodResources) List(ctx context.Context) ([]*podresourcesapi.PodResources, error) {
	f.mu.Lock()
	delay := f.delay
	f.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if len(f.failures) > 0 {
		code := f.failures[0]
		f.failures = f.failures[1:]
		return nil, status.Error(code, "fake PodResources failure")
	}
	var out []*podresourcesapi.PodResources
	for _, p := range f.pods {
		out = append(out, p)
	}
	return out, nil
}

// hold records that container of namespace/pod holds ids of hami.io/gpu.
func (f *fakePodResources) hold(namespace, pod, container string, ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := namespace + "/" + pod
	p, ok := f.pods[key]
	if !ok {
		p = &podresourcesapi.PodResources{Namespace: namespace, Name: pod}
		f.pods[key] = p
	}
	c := &podresourcesapi.ContainerResources{Name: container}
	for _, id := range ids {
		c.Devices = append(c.Devices, &podresourcesapi.ContainerDevices{ResourceName: string(vgpu.ResourceGPU), DeviceIds: []string{id}})
	}
	c.Devices = append(c.Devices, &podresourcesapi.ContainerDevices{ResourceName: "example.com/other", DeviceIds: []string{"x"}})
	p.Containers = append(p.Containers, c)
}

// admit lists namespace/pod without devices, as the kubelet does from the
// moment it starts admitting a pod until Allocate returns.
func (f *fakePodResources) admit(namespace, pod string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.pods[namespace+"/"+pod]; !ok {
		f.pods[namespace+"/"+pod] = &podresourcesapi.PodResources{Namespace: namespace, Name: pod}
	}
}

// forget removes a pod, as the kubelet does once it is gone.
func (f *fakePodResources) forget(namespace, pod string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pods, namespace+"/"+pod)
}

func (f *fakePodResources) fail(cs ...codes.Code) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = append(f.failures, cs...)
}

func (f *fakePodResources) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// handoffFixture is an allocator over a real pod informer (on client-go's
// fake clientset), a fake PodResources API and a fake event recorder.
type handoffFixture struct {
	t      testing.TB
	cfg    Config
	client *fake.Clientset
	view   *podView
	podRes *fakePodResources
	events *record.FakeRecorder
	alloc  *allocator
}

func fastTimings() timings {
	return timings{Budget: 300 * time.Millisecond, OwnerWait: 50 * time.Millisecond, RetryInitial: time.Millisecond, RetryMax: 10 * time.Millisecond, ClaimTTL: time.Minute, GCInterval: time.Hour, PreferWait: 100 * time.Millisecond, SpecSettle: time.Second}
}

func newHandoff(t testing.TB, mutate func(*Config)) *handoffFixture {
	t.Helper()
	cfg := validConfig()
	cfg.DevicePluginDir = t.TempDir()
	cfg.CDISpecDir = t.TempDir()
	cfg.StateDir = t.TempDir()
	cfg.NVIDIACDISpecs = []string{filepath.Join(t.TempDir(), "nvidia*.yaml")}
	cfg.MPSDir = t.TempDir()
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	inv, err := newInventory(cfg, handoffGPUs())
	if err != nil {
		t.Fatal(err)
	}
	f := &handoffFixture{t: t, cfg: cfg, client: fake.NewClientset(), podRes: newFakePodResources(), events: record.NewFakeRecorder(100)}
	if f.view, err = newPodView(clientset.New(f.client).NodePods(cfg.NodeName), cfg.NodeName); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.view.start(ctx)
	t.Cleanup(func() {
		cancel()
		f.view.stop()
	})
	if !cache.WaitForCacheSync(ctx.Done(), f.view.informer.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	claims := newClaimStore(filepath.Join(cfg.EffectiveStateDir(), checkpointFileName))
	f.alloc = &allocator{
		cfg: cfg, inv: inv, pods: f.view, live: cache.ToListerWithContext(clientset.New(f.client).NodePods(cfg.NodeName)),
		livePod: clientset.New(f.client).Pod,
		lister:  f.podRes, events: f.events, claims: claims,
		clock: clock.RealClock{}, t: fastTimings(), logger: ktesting.NewLogger(t, ktesting.DefaultConfig),
	}
	// No background write (the checkpoint, a prepared spec) outlives the
	// test's folders.
	t.Cleanup(func() {
		f.alloc.drain()
		_ = f.alloc.claims.flush()
	})
	f.useFacts(handoff.NodeFacts{})
	return f
}

// apiServerHas makes the API server the allocator reads when its view may
// lag hold exactly pods (copies).
func (f *handoffFixture) apiServerHas(pods ...*corev1.Pod) {
	objs := make([]runtime.Object, len(pods))
	for i, p := range pods {
		objs[i] = p.DeepCopy()
	}
	api := clientset.New(fake.NewClientset(objs...))
	f.alloc.live = cache.ToListerWithContext(api.NodePods(f.alloc.cfg.NodeName))
	f.alloc.livePod = api.Pod
}

// apiServerDown makes every read of the API server the allocator makes
// fail, as when it does not answer.
func (f *handoffFixture) apiServerDown() {
	down := errors.New("connection refused")
	f.alloc.live = &cache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		return nil, down
	}}
	f.alloc.livePod = func(context.Context, string, string) (*corev1.Pod, error) { return nil, down }
}

// useFacts makes the allocator enforce what the plugin would pick on a
// node with facts, as Run does (chooseEnforcement): the mechanism and, for
// driver, the NVIDIA CDI devices found through cfg.NVIDIACDISpecs.
func (f *handoffFixture) useFacts(facts handoff.NodeFacts) {
	f.t.Helper()
	c, err := chooseEnforcement(ktesting.NewLogger(f.t, ktesting.DefaultConfig), f.cfg, facts, handoffGPUs())
	if err != nil {
		f.t.Fatal(err)
	}
	f.alloc.enforcement, f.alloc.nvidiaCDI, f.alloc.driverUnverified = c.mech, c.nvidiaCDI(), c.unverified()
}

// gpuPod returns a pod bound to node-1 with allocation alloc (nil: none),
// created at created.
func gpuPod(name string, created time.Time, alloc *vgpu.PodAllocation, containers ...string) *corev1.Pod {
	b := vgputest.Pod(name).NodeName("node-1")
	for _, c := range containers {
		b.Container(c).GPU(1)
	}
	if alloc != nil {
		value, err := vgpu.EncodePodAllocation(*alloc)
		if err != nil {
			panic(err)
		}
		b.Annotation(vgpu.AnnotationPodAllocation, value)
	}
	pod := b.Obj()
	pod.CreationTimestamp = metav1.NewTime(created)
	return pod
}

func allocOf(b *vgputest.AllocationBuilder) *vgpu.PodAllocation {
	a := b.Obj()
	return &a
}

// addPod creates pod, waits until the plugin's view shows it and lists it
// in PodResources, as the kubelet does once it has the pod (addViewPod does
// not).
func (f *handoffFixture) addPod(pod *corev1.Pod) {
	f.t.Helper()
	f.addViewPod(pod)
	f.podRes.admit(pod.Namespace, pod.Name)
}

// addViewPod creates pod and waits until the plugin's view shows it; the
// kubelet does not list it yet.
func (f *handoffFixture) addViewPod(pod *corev1.Pod) {
	f.t.Helper()
	if _, err := f.client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.waitView(pod.Namespace+"/"+pod.Name+" in the pod view", func() bool {
		got, ok := f.view.Pod(pod.Namespace, pod.Name)
		return ok && got.UID == pod.UID
	})
}

// deletePod deletes a pod and waits until the view has lost it.
func (f *handoffFixture) deletePod(namespace, name string) {
	f.t.Helper()
	if err := f.client.CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.waitView(namespace+"/"+name+" gone from the pod view", func() bool {
		_, ok := f.view.Pod(namespace, name)
		return !ok
	})
}

func (f *handoffFixture) waitView(what string, cond func() bool) {
	f.t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		f.t.Fatalf("waiting for %s: %v", what, err)
	}
}

func (f *handoffFixture) preStart(ids ...string) error {
	_, err := f.alloc.preStart(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: ids})
	return err
}

func (f *handoffFixture) allocate(ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	resp, err := f.alloc.allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	return resp.GetContainerResponses()[0], nil
}

// event returns the next recorded event, or "" when there is none.
func (f *handoffFixture) event() string {
	select {
	case e := <-f.events.Events:
		return e
	default:
		return ""
	}
}

// readSpec reads the spec file of ids (the plugin's specFile).
func (f *handoffFixture) readSpec(ids ...string) *cdispecs.Spec {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.cfg.CDISpecDir, f.alloc.specFile(handoff.DeviceName(ids), f.alloc.cdiDeviceOf(ids))))
	if err != nil {
		f.t.Fatal(err)
	}
	var spec cdispecs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		f.t.Fatal(err)
	}
	return &spec
}

// ociResult is the part of an OCI runtime spec the tests compare.
type ociResult struct {
	Process struct {
		Env []string `json:"env"`
	} `json:"process"`
	Mounts []struct {
		Destination string   `json:"destination"`
		Source      string   `json:"source"`
		Options     []string `json:"options"`
	} `json:"mounts"`
	Hooks struct {
		CreateContainer []ociHook `json:"createContainer"`
	} `json:"hooks"`
}

// ociHook is one OCI hook.
type ociHook struct {
	Path string   `json:"path"`
	Args []string `json:"args"`
}

// inject resolves the qualified CDI device with the CDI library's own
// cache over the spec folder, as a container runtime does at
// CreateContainer, and returns what it put in an empty OCI spec.
func (f *handoffFixture) inject(qualified string) ociResult {
	f.t.Helper()
	c, err := cdi.NewCache(cdi.WithSpecDirs(f.cfg.CDISpecDir), cdi.WithAutoRefresh(false))
	if err != nil {
		f.t.Fatalf("CDI cache over the spec folder: %v (errors %v)", err, c.GetErrors())
	}
	got, err := injectInto(c.InjectDevices, qualified)
	if err != nil {
		f.t.Fatalf("CDI inject %s: %v (spec errors %v)", qualified, err, c.GetErrors())
	}
	return got
}

// injectInto calls inject on a new, empty OCI spec and decodes the result.
// The OCI type is inferred from inject, so the tests need not import the
// runtime-spec module directly.
func injectInto[S any](inject func(*S, ...string) ([]string, error), devices ...string) (ociResult, error) {
	var spec S
	if _, err := inject(&spec, devices...); err != nil {
		return ociResult{}, err
	}
	data, err := json.Marshal(&spec)
	if err != nil {
		return ociResult{}, err
	}
	var r ociResult
	err = json.Unmarshal(data, &r)
	return r, err
}

// specEnv returns the env of a spec's only device.
func specEnv(spec *cdispecs.Spec) []string {
	if len(spec.Devices) != 1 {
		return nil
	}
	return spec.Devices[0].ContainerEdits.Env
}

// envValue returns the value of name in a KEY=VALUE list.
func envValue(env []string, name string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}

// sortedCopy returns a sorted copy of s.
func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

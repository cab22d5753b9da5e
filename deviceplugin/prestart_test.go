package deviceplugin

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/node/kubeletstate"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// TestPreStartRefusals: every start the plugin cannot serve fails with
// FailedPrecondition and a message saying why, and a Warning event on the
// pod when the pod is known; no spec is written.
func TestPreStartRefusals(t *testing.T) {
	id := DeviceID(gpuA, 1)
	oneSlice := allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0))
	tests := []struct {
		name      string
		pod       *corev1.Pod // added to the API; nil: none
		held      string      // pod holding id in PodResources; "": none
		noView    bool
		wantErr   []string // substrings of the error
		wantEvent string   // prefix of the event; "": none
	}{
		{
			name: "no container holds the devices", pod: gpuPod("p", time.Now(), oneSlice, "main"),
			wantErr: []string{"no container holds exactly these devices", id, "init containers"},
		},
		{
			name: "pod not in the view", held: "ghost",
			wantErr:   []string{ReasonAllocationMissing, "default/ghost", "not in the plugin's view"},
			wantEvent: "Warning " + ReasonAllocationMissing,
		},
		{
			name: "no allocation annotation", pod: gpuPod("p", time.Now(), nil, "main"), held: "p",
			wantErr:   []string{ReasonAllocationMissing, vgpu.AnnotationPodAllocation, "gpuslice scheduler"},
			wantEvent: "Warning " + ReasonAllocationMissing + " container main:",
		},
		{
			name: "allocation without this container", held: "p",
			pod:       gpuPod("p", time.Now(), allocOf(vgputest.Allocation("node-1").Container("other").Slice(gpuA, 1024, 0)), "main"),
			wantErr:   []string{ReasonAllocationMissing, `no entry for container "main"`},
			wantEvent: "Warning " + ReasonAllocationMissing,
		},
		{
			name: "slice count differs from device count", held: "p",
			pod:       gpuPod("p", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0).Slice(gpuB, 1024, 0)), "main"),
			wantErr:   []string{ReasonAllocationMismatch, "holds 1 hami.io/gpu devices on GPUs [" + gpuA + "], but the allocation of pod default/p (UID uid-p) has 2 GPU slices on"},
			wantEvent: "Warning " + ReasonAllocationMismatch,
		},
		{
			name: "allocation for another node", held: "p",
			pod:       gpuPod("p", time.Now(), allocOf(vgputest.Allocation("node-2").Container("main").Slice(gpuA, 1024, 0)), "main"),
			wantErr:   []string{ReasonAllocationMismatch, `"node-2"`, `"node-1"`},
			wantEvent: "Warning " + ReasonAllocationMismatch,
		},
		{
			name: "allocation names a GPU this node lacks", held: "p",
			pod:       gpuPod("p", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice("GPU-elsewhere", 1024, 0)), "main"),
			wantErr:   []string{ReasonAllocationMismatch, "has 1 GPU slices on [GPU-elsewhere]"},
			wantEvent: "Warning " + ReasonAllocationMismatch,
		},
		{
			name: "malformed allocation", held: "p",
			pod:       vgputest.Pod("p").NodeName("node-1").Container("main").GPU(1).Annotation(vgpu.AnnotationPodAllocation, "{not json").Obj(),
			wantErr:   []string{ReasonAllocationInvalid, vgpu.AnnotationPodAllocation},
			wantEvent: "Warning " + ReasonAllocationInvalid,
		},
		{
			name: "no API server", noView: true, held: "p",
			wantErr: []string{"no API server configured"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
			if tt.pod != nil {
				f.addPod(tt.pod)
			}
			if tt.held != "" {
				f.podRes.hold("default", tt.held, "main", id)
			}
			if tt.noView {
				f.alloc.pods = nil
			}
			err := f.preStart(id)
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("preStart = %v, want code FailedPrecondition", err)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			ev := f.event()
			if tt.wantEvent == "" && ev != "" || !strings.HasPrefix(ev, tt.wantEvent) {
				t.Errorf("event %q, want one starting with %q", ev, tt.wantEvent)
			}
			if names := readDirNames(t, f.cfg.CDISpecDir); len(names) != 0 {
				t.Errorf("a refused start left files in the spec folder: %v", names)
			}
		})
	}
}

// TestPreStartRetriesPodResources: the PodResources API rejects calls over
// its rate limit at once (ResourceExhausted); PreStartContainer retries
// within its budget.
func TestPreStartRetriesPodResources(t *testing.T) {
	tests := []struct {
		name      string
		failures  []codes.Code
		wantCalls int
		wantCode  codes.Code
	}{
		{name: "two rejections, then an answer", failures: []codes.Code{codes.ResourceExhausted, codes.ResourceExhausted}, wantCalls: 3},
		{name: "kubelet restarting, then an answer", failures: []codes.Code{codes.Unavailable}, wantCalls: 2},
		{name: "rejected past the budget", failures: repeatCode(codes.ResourceExhausted, 10000), wantCode: codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
			id := DeviceID(gpuB, 3)
			f.addPod(gpuPod("p", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 1024, 0)), "main"))
			f.podRes.hold("default", "p", "main", id)
			f.podRes.fail(tt.failures...)
			err := f.preStart(id)
			if status.Code(err) != tt.wantCode {
				t.Fatalf("preStart = %v, want code %v", err, tt.wantCode)
			}
			if tt.wantCode != codes.OK {
				if !strings.Contains(err.Error(), "ResourceExhausted") {
					t.Errorf("error %q does not name the last PodResources failure", err)
				}
				return
			}
			if got := f.podRes.callCount(); got != tt.wantCalls {
				t.Errorf("PodResources calls = %d, want %d", got, tt.wantCalls)
			}
			if got := envValue(specEnv(f.readSpec(id)), handoff.EnvPod); got != "default/p" {
				t.Errorf("spec %s = %q, want default/p", handoff.EnvPod, got)
			}
		})
	}
}

// TestPreStartWaitsForTheView: the pod view may lag the kubelet; a pod
// that shows up (with its allocation) within the budget is served.
func TestPreStartWaitsForTheView(t *testing.T) {
	f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB" })
	f.alloc.t.Budget = 10 * time.Second
	id := DeviceID(gpuA, 5)
	f.podRes.hold("default", "late", "main", id)
	done := make(chan error, 1)
	before := f.podRes.callCount()
	go func() { done <- f.preStart(id) }()
	// PreStart has found the owner through PodResources and now waits for
	// the view.
	waitUntil(t, "PreStartContainer asked PodResources", func() bool { return f.podRes.callCount() > before })
	f.addPod(gpuPod("late", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 512, 0)), "main"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := envValue(specEnv(f.readSpec(id)), handoff.EnvPod); got != "default/late" {
		t.Errorf("spec %s = %q, want default/late", handoff.EnvPod, got)
	}
}

// TestPreStartRefusesStalePodOfTheSameName is a StatefulSet's web-0
// deleted and created again on the node while the plugin's view still shows
// the old pod: PodResources names the new container by namespace and name
// only, and its devices are on the GPU of the new pod's allocation, not the
// old one's. The start is refused with an event that says why, and the
// retry succeeds once the view shows the new pod, with its own slice.
func TestPreStartRefusesStalePodOfTheSameName(t *testing.T) {
	f := newHandoff(t, nil)
	_, id := staleWeb0(f)

	err := f.preStart(id)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("preStart with the old pod in the view = %v, want FailedPrecondition", err)
	}
	for _, want := range []string{ReasonAllocationMismatch, "on GPUs [" + gpuB + "]", "(UID uid-old) has 1 GPU slices on [" + gpuA + "]", "the start is retried"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if e := f.event(); !strings.Contains(e, "Warning "+ReasonAllocationMismatch) || !strings.Contains(e, "another pod of that name") {
		t.Errorf("event = %q, want a %s warning saying why", e, ReasonAllocationMismatch)
	}

	f.deletePod("default", "web-0")
	recreated := recreatedWeb0()
	f.addPod(recreated)
	if err := f.preStart(id); err != nil {
		t.Fatalf("preStart once the view shows the new pod: %v", err)
	}
	wantRecreatedSpec(t, f, id)
}

// TestPreStartConfirmsThePodWithTheAPIServer is the same race when the new
// pod's slice is on the same GPU as the old pod's: the devices match both
// allocations, so only the API server tells the pods apart. The container
// must get the new pod's identity and limit, not the old pod's (found by
// the chaos soak: a container started with another pod's UID and memory
// limit). A start the API server cannot confirm is refused and retried.
func TestPreStartConfirmsThePodWithTheAPIServer(t *testing.T) {
	f := newHandoff(t, nil)
	old := gpuPod("web-0", time.Now().Add(-time.Hour), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 40960, 0)), "main")
	old.UID = "uid-old"
	f.addPod(old)
	recreated := recreatedWeb0()
	// The API server has only the new pod; the plugin's view still shows the old one.
	f.apiServerHas(recreated)
	id := DeviceID(gpuB, 0)
	f.podRes.hold("default", "web-0", "main", id)

	if err := f.preStart(id); err != nil {
		t.Fatalf("preStart with the new pod on the API server: %v", err)
	}
	wantRecreatedSpec(t, f, id)

	f.apiServerDown()
	err := f.preStart(id)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cannot confirm with the API server") || !strings.Contains(err.Error(), "retried") {
		t.Errorf("preStart with the API server down = %v, want FailedPrecondition saying the pod cannot be confirmed and the start is retried", err)
	}
}

// TestPreStartTakesTheKubeletsRecordOfThePod: the kubelet's device
// checkpoint gives the devices to the view's pod, by UID, so the start
// needs no read of the API server (it does not answer here). When it gives
// them to another UID (web-0 created again while the view lags), the API
// server is asked as before, and decides.
func TestPreStartTakesTheKubeletsRecordOfThePod(t *testing.T) {
	f := newHandoff(t, nil)
	old := gpuPod("web-0", time.Now().Add(-time.Hour), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 40960, 0)), "main")
	old.UID = "uid-old"
	f.addPod(old)
	id := DeviceID(gpuB, 0)
	f.podRes.hold("default", "web-0", "main", id)
	f.apiServerDown()

	f.kubeletCheckpoint("uid-old", "main", id)
	if err := f.preStart(id); err != nil {
		t.Fatalf("preStart with the kubelet's checkpoint naming the view's pod and the API server down: %v", err)
	}
	if got := envValue(specEnv(f.readSpec(id)), handoff.EnvPodUID); got != "uid-old" {
		t.Errorf("spec %s = %q, want uid-old", handoff.EnvPodUID, got)
	}

	f.kubeletCheckpoint("uid-new", "main", id)
	if err := f.preStart(id); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cannot confirm with the API server") {
		t.Errorf("preStart with the checkpoint naming another UID and the API server down = %v, want FailedPrecondition: cannot confirm", err)
	}
	f.apiServerHas(recreatedWeb0())
	if err := f.preStart(id); err != nil {
		t.Fatalf("preStart with the checkpoint and the API server naming the new pod: %v", err)
	}
	wantRecreatedSpec(t, f, id)
}

// kubeletCheckpoint writes the kubelet's device checkpoint in the plugin's
// device-plugin folder, as a kubelet would: container of pod UID uid holds
// ids of the plugin's resource.
func (f *handoffFixture) kubeletCheckpoint(uid, container string, ids ...string) {
	f.t.Helper()
	f.kubeletCheckpointAnswer(uid, container, nil, ids...)
}

// kubeletCheckpointAnswer is kubeletCheckpoint with resp, the plugin's
// Allocate answer for the container, which the kubelet keeps in its entry
// (protobuf-encoded); nil keeps none.
func (f *handoffFixture) kubeletCheckpointAnswer(uid, container string, resp *pluginapi.ContainerAllocateResponse, ids ...string) {
	f.t.Helper()
	var answer []byte
	if resp != nil {
		var err error
		if answer, err = proto.Marshal(resp); err != nil {
			f.t.Fatal(err)
		}
	}
	type entry struct {
		PodUID, ContainerName, ResourceName string
		DeviceIDs                           map[string][]string
		AllocResp                           []byte
	}
	var cp struct {
		Data struct {
			PodDeviceEntries  []entry
			RegisteredDevices map[string][]string
		}
		Checksum uint64
	}
	cp.Data.PodDeviceEntries = []entry{{PodUID: uid, ContainerName: container, ResourceName: f.cfg.ResourceName, DeviceIDs: map[string][]string{"-1": ids}, AllocResp: answer}}
	data, err := json.Marshal(cp)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.cfg.DevicePluginDir, kubeletstate.CheckpointFile), data, 0o600); err != nil {
		f.t.Fatal(err)
	}
}

func TestPreStartBadIDs(t *testing.T) {
	f := newHandoff(t, nil)
	for _, ids := range [][]string{nil, {"nvidia0"}, {DeviceID("GPU-gone", 0)}} {
		if err := f.preStart(ids...); status.Code(err) != codes.InvalidArgument {
			t.Errorf("preStart(%v) = %v, want InvalidArgument", ids, err)
		}
	}
}

func TestPluginOptions(t *testing.T) {
	want := &pluginapi.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}
	got, err := (&endpoint{}).GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want.String(), got.String()); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
}

func repeatCode(c codes.Code, n int) []codes.Code {
	out := make([]codes.Code, n)
	for i := range out {
		out[i] = c
	}
	return out
}

// readDirNames lists the names in dir.
func readDirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestPreStartAsksTheAPIServerWhenTheViewStaysStale: the view's watch
// stays broken (the API server restarted, its back-off runs) and keeps
// showing an old web-0 on GPU A while the kubelet starts the new web-0
// with its devices on GPU B. Once the view has not caught up within the
// owner wait, the API server's web-0 decides: the new pod, whose slice is
// on B, gets its own identity and limit. When the API server has the
// view's pod itself, the start is refused as before.
func TestPreStartAsksTheAPIServerWhenTheViewStaysStale(t *testing.T) {
	f := newHandoff(t, nil)
	old, id := staleWeb0(f)

	f.apiServerHas(old)
	if err := f.preStart(id); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), ReasonAllocationMismatch) {
		t.Fatalf("preStart with the old pod on the API server too = %v, want FailedPrecondition %s", err, ReasonAllocationMismatch)
	}

	recreated := recreatedWeb0()
	f.apiServerHas(recreated)
	if err := f.preStart(id); err != nil {
		t.Fatalf("preStart with the new pod on the API server and the old one in the view: %v", err)
	}
	wantRecreatedSpec(t, f, id)
}

// TestPreStartAsksTheAPIServerForAPodMissingFromTheView: the view's watch
// stays broken and never shows the new pod; past the owner wait the API
// server's pod of that name is read and served with its own slice.
func TestPreStartAsksTheAPIServerForAPodMissingFromTheView(t *testing.T) {
	f := newHandoff(t, nil)
	f.alloc.t.Budget = 10 * time.Second
	pod := gpuPod("unseen", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 2048, 0)), "main")
	f.apiServerHas(pod)
	id := DeviceID(gpuB, 0)
	f.podRes.hold("default", "unseen", "main", id)
	if err := f.preStart(id); err != nil {
		t.Fatalf("preStart of a pod only the API server has: %v", err)
	}
	if got := envValue(specEnv(f.readSpec(id)), handoff.EnvPod); got != "default/unseen" {
		t.Errorf("spec %s = %q, want default/unseen", handoff.EnvPod, got)
	}
}

// recreatedWeb0 is web-0 created again (UID uid-new) with a 2048 MiB slice
// on GPU B.
func recreatedWeb0() *corev1.Pod {
	p := gpuPod("web-0", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 2048, 0)), "main")
	p.UID = "uid-new"
	return p
}

// wantRecreatedSpec checks that the CDI spec of id gives its container
// recreatedWeb0's identity and memory limit.
func wantRecreatedSpec(t *testing.T, f *handoffFixture, id string) {
	t.Helper()
	env := specEnv(f.readSpec(id))
	if got := []string{envValue(env, handoff.EnvPodUID), envValue(env, handoff.EnvMemoryLimitPrefix+"0")}; !slices.Equal(got, []string{"uid-new", "2048m"}) {
		t.Errorf("spec pod UID and memory limit = %v, want the new pod's [uid-new 2048m]", got)
	}
}

// staleWeb0 puts web-0 (UID uid-old, a 40960 MiB slice on GPU A) in f's
// view and API server, and has PodResources say that its container holds
// a device on GPU B, which it returns: the kubelet starts a web-0 created
// again, which the view has not shown yet.
func staleWeb0(f *handoffFixture) (*corev1.Pod, string) {
	old := gpuPod("web-0", time.Now().Add(-time.Hour), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 40960, 0)), "main")
	old.UID = "uid-old"
	f.addPod(old)
	id := DeviceID(gpuB, 0)
	f.podRes.hold("default", "web-0", "main", id)
	return old, id
}

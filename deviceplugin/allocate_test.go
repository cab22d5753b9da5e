package deviceplugin

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/node/handoff"
	"github.com/gpuslice/gpuslice/vgpu"
	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

func TestAllocate(t *testing.T) {
	f := newHandoff(t, nil)
	t0 := time.Now().Add(-time.Hour)
	f.addPod(gpuPod("on-a", t0, allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0)), "main"))
	f.addPod(gpuPod("on-b", t0, allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 1024, 0)), "main"))
	f.addPod(gpuPod("on-both", t0, allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0).Slice(gpuB, 1024, 0)), "main"))
	// Created with spec.nodeName set: no scheduler, no allocation.
	f.addPod(gpuPod("bypass", t0, nil, "main"))
	tests := []struct {
		name     string
		ids      [][]string
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "one slice", ids: [][]string{{DeviceID(gpuA, 3)}}},
		{name: "key ignores order", ids: [][]string{{DeviceID(gpuB, 0), DeviceID(gpuA, 0)}}},
		{name: "one answer per container", ids: [][]string{{DeviceID(gpuA, 0)}, {DeviceID(gpuB, 5)}}},
		{name: "no IDs", ids: [][]string{{}}, wantCode: codes.InvalidArgument, wantMsg: "no device IDs"},
		{name: "foreign ID", ids: [][]string{{"nvidia0"}}, wantCode: codes.InvalidArgument, wantMsg: `device ID "nvidia0" was not made by this plugin`},
		{name: "unknown GPU", ids: [][]string{{DeviceID(gpuA, 0)}, {DeviceID("GPU-gone", 0)}}, wantCode: codes.InvalidArgument, wantMsg: "names GPU GPU-gone, which this node does not advertise"},
		{
			name: "no allocation has that many slices on these GPUs", ids: [][]string{{DeviceID(gpuA, 0), DeviceID(gpuA, 1)}}, wantCode: codes.FailedPrecondition,
			wantMsg: "the kubelet chose hami.io/gpu devices [" + DeviceID(gpuA, 0) + " " + DeviceID(gpuA, 1) + "] on GPUs [" + gpuA + "], but container",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &pluginapi.AllocateRequest{}
			for _, ids := range tt.ids {
				req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
			}
			resp, err := f.alloc.allocate(context.Background(), req)
			if tt.wantCode != codes.OK {
				if status.Code(err) != tt.wantCode || resp != nil || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("allocate = %v, %v; want nil, code %v, a message containing %q", resp, err, tt.wantCode, tt.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// One CDI device per container: a name of its holding, which
			// the plugin recorded for PreStartContainer.
			var got, want []string
			for i, c := range resp.GetContainerResponses() {
				for _, d := range c.GetCdiDevices() {
					got = append(got, d.GetName())
				}
				if len(c.GetEnvs()) != 0 {
					t.Errorf("mode cdi answered env %v; the CDI spec carries it", c.GetEnvs())
				}
				name := f.alloc.cdiDeviceOf(tt.ids[i])
				if !handoff.IsHolderName(name, handoff.DeviceName(tt.ids[i])) {
					t.Errorf("recorded CDI device %q is not a holder name of devices %v", name, tt.ids[i])
				}
				want = append(want, handoff.CDIQualifiedName(name))
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("CDI devices per container (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAllocateRefusesPodWithoutAllocation: a GPU pod created with
// spec.nodeName set never went through the scheduler, so no allocation
// covers its devices; Allocate refuses with a message that says so, and the
// kubelet rejects the pod instead of holding its devices.
func TestAllocateRefusesPodWithoutAllocation(t *testing.T) {
	f := newHandoff(t, nil)
	f.addPod(gpuPod("bypass", time.Now(), nil, "main"))
	f.podRes.admit("default", "bypass")
	_, err := f.allocate(DeviceID(gpuA, 0))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("allocate = %v, want FailedPrecondition", err)
	}
	for _, want := range []string{"hami.io/gpu-allocation", "spec.nodeName", "gpuslice scheduler"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("allocate error %q does not contain %q", err, want)
		}
	}
}

// TestAllocateRefusesDevicesTheAdmittedPodCannotUse: the kubelet chose
// devices on GPU A for the pod it admits, whose allocation is on GPU B;
// another pod of the view that the kubelet does not list yet is on GPU A.
// Taking that pod as the owner let the start be refused forever (found by
// the chaos soak); Allocate refuses instead, so the kubelet rejects the pod
// and frees the devices, with a message naming both GPUs.
func TestAllocateRefusesDevicesTheAdmittedPodCannotUse(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	f := newHandoff(t, nil)
	f.addViewPod(gpuPod("later", t0, allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0)), "main"))
	f.addPod(gpuPod("admitted", t0.Add(time.Minute), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 1024, 0)), "main"))
	_, err := f.allocate(DeviceID(gpuA, 0))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("allocate = %v, want FailedPrecondition", err)
	}
	for _, want := range []string{"the kubelet chose", "default/admitted/main", gpuA, gpuB} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("allocate error %q does not contain %q", err, want)
		}
	}
	// Once the kubelet lists it, the other pod's own Allocate succeeds.
	f.podRes.forget("default", "admitted")
	f.podRes.admit("default", "later")
	if _, err := f.allocate(DeviceID(gpuA, 0)); err != nil {
		t.Errorf("allocate for the listed pod on its GPU = %v", err)
	}
}

// TestAllocateRefusesAtOnceWhenTheAdmittedPodsGPUIsUnhealthy: the pod the
// kubelet admits was placed on GPU B, which went unhealthy since, so the
// kubelet had no device there and chose one on GPU A. Waiting cannot help
// once the API server confirms the pod: Allocate refuses at once, saying
// that B is unhealthy.
func TestAllocateRefusesAtOnceWhenTheAdmittedPodsGPUIsUnhealthy(t *testing.T) {
	f := newHandoff(t, nil)
	f.alloc.t.OwnerWait = time.Hour
	f.addPod(gpuPod("admitted", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 1024, 0)), "main"))
	f.alloc.inv.setHealth(vgpu.HealthEvent{UUID: gpuB, Health: vgpu.Unhealthy, Reason: "XID 79"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := f.alloc.allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{DeviceID(gpuA, 0)}}}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("allocate = %v, want FailedPrecondition at once", err)
	}
	if want := gpuB + " is unhealthy"; !strings.Contains(err.Error(), want) {
		t.Errorf("allocate error %q does not contain %q", err, want)
	}
}

// TestAllocateAsksForAPodsFirstPendingContainer: the kubelet allocates a
// pod's containers in order. Container c0 was placed on GPU A, which went
// unhealthy, so the kubelet chose a device on GPU B for it; c1's own slice
// is on B. GetPreferredAllocation must not steer c0 to c1's GPU, and
// Allocate must refuse the device, naming c0, rather than let c0 take it
// and then be refused at every start (its slice is on A). Once c0 holds
// its devices, c1 is the one asking, and B is its GPU.
func TestAllocateAsksForAPodsFirstPendingContainer(t *testing.T) {
	f := newHandoff(t, nil)
	f.alloc.t.OwnerWait = time.Hour
	pod := gpuPod("two", time.Now(), allocOf(vgputest.Allocation("node-1").Container("c0").Slice(gpuA, 1024, 0).Container("c1").Slice(gpuB, 1024, 0)), "c0", "c1")
	f.addPod(pod)
	f.alloc.inv.setHealth(vgpu.HealthEvent{UUID: gpuA, Health: vgpu.Unhealthy, Reason: "XID 79"})

	onlyB := devicesOf()[DefaultSplitCount:]
	if got, want := f.prefer(onlyB, nil, 1), onlyB[:1]; !slices.Equal(got, want) {
		t.Errorf("preferred devices for c0 = %v, want the kubelet's own choice %v (no offer on c1's GPU)", got, want)
	}
	if f.alloc.claims.recentlyOffered(containerRef{Namespace: "default", Pod: "two", Container: "c1"}, pod.UID, time.Time{}) {
		t.Error("c1 was offered devices, but it is not the container asking")
	}
	_, err := f.allocate(DeviceID(gpuB, 0))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("allocate for c0 on GPU B = %v, want FailedPrecondition", err)
	}
	for _, want := range []string{"default/two/c0", gpuA + " is unhealthy"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("allocate error %q does not contain %q", err, want)
		}
	}

	f.podRes.hold("default", "two", "c0", DeviceID(gpuA, 0))
	if _, err := f.allocate(DeviceID(gpuB, 0)); err != nil {
		t.Errorf("allocate for c1 on its GPU = %v", err)
	}
}

// TestAllocateTakesTheFreshOffer: right after GetPreferredAllocation
// offered devices to the pod the kubelet admits, Allocate for exactly those
// devices answers without listing PodResources again; for other devices,
// or once the offer is older than offerTrust, it lists and decides as
// before.
func TestAllocateTakesTheFreshOffer(t *testing.T) {
	f := newHandoff(t, nil)
	f.addPod(gpuPod("admitted", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuB, 1024, 0)), "main"))
	pick := f.prefer(devicesOf(), nil, 1)
	if want := []string{DeviceID(gpuB, 0)}; !slices.Equal(pick, want) {
		t.Fatalf("preferred devices = %v, want %v", pick, want)
	}
	lists := f.podRes.callCount()
	if _, err := f.allocate(pick...); err != nil {
		t.Fatalf("allocate of the offered devices = %v", err)
	}
	if n := f.podRes.callCount() - lists; n != 0 {
		t.Errorf("allocate of the offered devices listed PodResources %d times, want none", n)
	}

	// Devices on another GPU than the offer's: listed, and refused.
	if _, err := f.allocate(DeviceID(gpuA, 0)); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("allocate of devices on another GPU = %v, want FailedPrecondition", err)
	}
	if n := f.podRes.callCount() - lists; n == 0 {
		t.Error("allocate of devices nobody was offered did not list PodResources")
	}

	// A stale offer is not trusted.
	o, _ := f.alloc.claims.offered(handoff.DeviceName(pick))
	o.At = time.Now().Add(-offerTrust - time.Second)
	f.alloc.claims.offer(o)
	lists = f.podRes.callCount()
	if _, err := f.allocate(pick...); err != nil {
		t.Fatalf("allocate of the devices after the offer went stale = %v", err)
	}
	if n := f.podRes.callCount() - lists; n == 0 {
		t.Error("allocate after the offer went stale did not list PodResources")
	}
}

package deviceplugin

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/vgpu/vgputest"
)

// fuzzIDs seeds the device-ID fuzzers: IDs of this plugin, of other GPUs, of other plugins,
// and shapes no kubelet sends. A seed is the IDs of one request, joined with "\n".
var fuzzIDs = []string{
	DeviceID(gpuA, 0),
	DeviceID(gpuA, 1) + "\n" + DeviceID(gpuB, 3),
	DeviceID(gpuA, 0) + "\n" + DeviceID(gpuA, 0),
	DeviceID("GPU-gone", 0),
	"nvidia0", "", "\n\n", gpuA + "::", "::7", gpuA + "::-1", gpuA + "::99999999999999999999",
	strings.Repeat("x", 300), gpuA + "::1::2", "GPU-\x00::1",
}

// newFuzzHandoff is a hand-off fixture whose view holds one pending container on gpuA, so that
// well-formed IDs reach the allocation checks.
func newFuzzHandoff(f *testing.F) *handoffFixture {
	h := newHandoff(f, nil)
	// The fixture's logger belongs to f, which a fuzz target must not use.
	h.alloc.logger = logr.Discard()
	h.addPod(gpuPod("fuzz", time.Now(), allocOf(vgputest.Allocation("node-1").Container("main").Slice(gpuA, 1024, 0)), "main"))
	return h
}

// checkRPCError fails t unless err is nil or a gRPC status a caller can act on: a known code
// and a message.
func checkRPCError(t *testing.T, call string, ids []string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	s, ok := status.FromError(err)
	switch {
	case !ok:
		t.Fatalf("%s(%q) = %v, not a gRPC status", call, ids, err)
	case s.Message() == "":
		t.Fatalf("%s(%q): code %v without a message", call, ids, s.Code())
	case !slices.Contains([]codes.Code{codes.InvalidArgument, codes.FailedPrecondition, codes.Unavailable}, s.Code()):
		t.Fatalf("%s(%q) = %v, want InvalidArgument, FailedPrecondition or Unavailable", call, ids, err)
	}
}

func FuzzAllocate(f *testing.F) {
	for _, s := range fuzzIDs {
		f.Add(s)
	}
	h := newFuzzHandoff(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := strings.Split(s, "\n")
		resp, err := h.alloc.allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
		checkRPCError(t, "Allocate", ids, err)
		if err == nil && len(resp.GetContainerResponses()) != 1 {
			t.Fatalf("Allocate(%q): %d container answers, want 1", ids, len(resp.GetContainerResponses()))
		}
	})
}

func FuzzPreStartContainer(f *testing.F) {
	for _, s := range fuzzIDs {
		f.Add(s)
	}
	h := newFuzzHandoff(f)
	h.podRes.hold("default", "fuzz", "main", DeviceID(gpuA, 0))
	f.Fuzz(func(t *testing.T, s string) {
		ids := strings.Split(s, "\n")
		checkRPCError(t, "PreStartContainer", ids, h.preStart(ids...))
	})
}

// FuzzGetPreferredAllocation: any request gets an answer (never an error), made of requested
// IDs only, without repeats, at most AllocationSize of them plus the must-include ones.
func FuzzGetPreferredAllocation(f *testing.F) {
	for _, s := range fuzzIDs {
		f.Add(s, DeviceID(gpuA, 2), int32(1))
	}
	f.Add(DeviceID(gpuA, 1)+"\n"+DeviceID(gpuB, 1), "", int32(-3))
	f.Add("", DeviceID(gpuB, 1)+"\n"+DeviceID(gpuB, 1), int32(1<<30))
	h := newFuzzHandoff(f)
	f.Fuzz(func(t *testing.T, available, must string, size int32) {
		avail, mustIDs := strings.Split(available, "\n"), strings.Split(must, "\n")
		if must == "" {
			mustIDs = nil
		}
		resp := h.alloc.preferred(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: avail, MustIncludeDeviceIDs: mustIDs, AllocationSize: size,
		}}})
		if len(resp.GetContainerResponses()) != 1 {
			t.Fatalf("%d container answers, want 1", len(resp.GetContainerResponses()))
		}
		got := resp.GetContainerResponses()[0].GetDeviceIDs()
		for i, id := range got {
			if !slices.Contains(avail, id) && !slices.Contains(mustIDs, id) {
				t.Fatalf("answer %q holds %q, which was neither available nor must-include", got, id)
			}
			if slices.Contains(got[:i], id) {
				t.Fatalf("answer %q repeats %q", got, id)
			}
		}
		if limit := max(int(size), 0) + len(mustIDs); len(got) > limit {
			t.Fatalf("answer %q: %d IDs for size %d and %d must-include", got, len(got), size, len(mustIDs))
		}
	})
}

package retry

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
)

// TestPending checks that each waiting pod counts under the most hopeful
// class of its reasons, and that the oldest wait is timed from the first
// rejection, not the latest.
func TestPending(t *testing.T) {
	clock := now
	r := New[string](func() time.Time { return clock })
	reject := func(name string, unjudged bool, reasons ...vgpu.Reason) {
		rej := Rejection{Unjudged: unjudged}
		for i, reason := range reasons {
			rej.Add(i, reason)
		}
		r.Rejected(pod(name), name, r.Seen(), rej)
	}
	reject("room", false, vgpu.ReasonNoHeartbeat, vgpu.ReasonModel, vgpu.ReasonInsufficientMemory)
	reject("model", false, vgpu.ReasonNoHeartbeat, vgpu.ReasonUnhealthy)
	reject("unsynced", true)
	clock = now.Add(time.Minute)
	reject("room", false, vgpu.ReasonNoFreeSlice) // again: still waiting since now
	reject("late", false, vgpu.ReasonNUMA)
	want := [Classes]Figures{
		ClassCapacity:  {Count: 2, Oldest: 2 * time.Minute},
		ClassInventory: {Count: 1, Oldest: 2 * time.Minute},
		ClassNotReady:  {Count: 1, Oldest: 2 * time.Minute},
	}
	if diff := cmp.Diff(want, r.Pending(now.Add(2*time.Minute))); diff != "" {
		t.Errorf("Pending (-want +got):\n%s", diff)
	}
	r.Forget(pod("room").UID)
	want[ClassCapacity] = Figures{Count: 1, Oldest: time.Minute}
	if diff := cmp.Diff(want, r.Pending(now.Add(2*time.Minute))); diff != "" {
		t.Errorf("Pending after room went (-want +got):\n%s", diff)
	}
}

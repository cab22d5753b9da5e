//go:build nvml

package nvidia

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/gpuslice/gpuslice/vgpu"
)

// TestRealNVML runs the backend over the machine's NVIDIA driver. Run it
// with "go test -tags nvml -run TestRealNVML ./node/nvidia/" on a
// GPU node.
func TestRealNVML(t *testing.T) {
	logger, ctx := ktesting.NewTestContext(t)
	b, err := Open(Options{Logger: logger, EventWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()

	gpus, err := b.GPUs()
	if err != nil {
		t.Fatalf("GPUs: %v", err)
	}
	if len(gpus) == 0 {
		t.Fatal("GPUs returned no GPU")
	}
	for i, g := range gpus {
		t.Logf("GPU %d: %+v", i, g)
		if !strings.HasPrefix(g.UUID, "GPU-") || g.Index != i || g.Model == "" || g.TotalMemoryMiB <= 0 ||
			g.PCIBusID == "" || g.CoresPercent != 100 || g.Health != vgpu.Healthy || g.NUMANode < -1 {
			t.Errorf("GPU %d looks wrong: %+v", i, g)
		}
	}

	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	events := make(chan vgpu.HealthEvent, 16)
	if err := b.WatchHealth(ctx, events); err != nil {
		t.Errorf("WatchHealth: %v", err)
	}
	close(events)
	for ev := range events {
		t.Errorf("unexpected health event on an idle GPU: %+v", ev)
	}
}

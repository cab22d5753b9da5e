package deviceplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/deviceplugin"
	"github.com/gpuslice/gpuslice/node/nvidia"
	"github.com/gpuslice/gpuslice/test/harness/devicemanager"
)

// TestResetPendingSurvivesPluginRestart: on the real device manager, a GPU
// whose XID needs a reset leaves allocatable, and a plugin restart (a new
// plugin on the same state folder and fake faults folder, as after an OOM
// kill or a rollout) does not put it back, not even for a moment; once a
// reset is injected it returns, and its fault record is gone.
func TestResetPendingSurvivesPluginRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	faults := t.TempDir()
	withFaults := func(c *deviceplugin.Config) { c.FakeGPUFaultsDir = faults }
	m := devicemanager.Start(t, dir)
	p := startPluginWith(t, dir, nil, withFaults)
	all, down := int64(allDevices), int64(allDevices-splitCount)
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, all, all); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, waitLong, "the health watch on GPU 1", func() bool { return p.fake.Watched(1) })
	if _, err := nvidia.WriteFakeFault(faults, nvidia.FakeFault{GPU: 1, XID: 48}); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, all, down); err != nil {
		t.Fatalf("after XID 48 on GPU 1: %v", err)
	}
	record := filepath.Join(p.cfg.FaultRecordDir(), nvidia.FakeUUID(nodeName, 1)+".json")
	if _, err := os.Stat(record); err != nil {
		t.Errorf("fault record of GPU 1: %v", err)
	}

	// The most devices the kubelet counts allocatable from the restart on.
	var most atomic.Int64
	ctx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			if _, a := m.Resource(resourceName); a > most.Load() {
				most.Store(a)
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
	}()
	p.stop()
	p = startPluginWith(t, dir, nil, withFaults)
	waitUntil(t, waitLong, "the restarted plugin registered", p.plugin.Registered)
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, all, down); err != nil {
		t.Fatalf("after the plugin restarted: %v", err)
	}
	stopSampling()
	<-sampled
	if got := most.Load(); got > down {
		t.Errorf("allocatable reached %d after the restart, want at most %d: GPU 1 was advertised before its reset", got, down)
	}

	if _, err := nvidia.WriteFakeFault(faults, nvidia.FakeFault{GPU: 1, Reset: true}); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitResource(waitCtx(t, waitLong), resourceName, all, all); err != nil {
		t.Fatalf("after GPU 1 was reset: %v", err)
	}
	if _, err := os.Stat(record); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("fault record of GPU 1 after the reset: %v, want it removed", err)
	}
}

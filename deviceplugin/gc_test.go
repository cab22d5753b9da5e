package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	"github.com/gpuslice/gpuslice/node/handoff"
)

// TestStaleSpecGC: specs of devices a container holds stay; specs of
// devices nobody holds go once they are a minute old; young ones, foreign
// files and the state folder's own files stay; temporary leftovers go.
func TestStaleSpecGC(t *testing.T) {
	f := newHandoff(t, func(c *Config) { c.FakeGPUs = "2xA100-80GB"; c.HostLibVGPU = "/opt/hami/libvgpu.so" })
	dir := f.cfg.CDISpecDir
	live, staleOld, staleYoung := handoff.DeviceName([]string{DeviceID(gpuA, 0)}), handoff.DeviceName([]string{DeviceID(gpuA, 1)}), handoff.DeviceName([]string{DeviceID(gpuB, 1)})
	f.podRes.hold("default", "p", "main", DeviceID(gpuA, 0))
	old := time.Now().Add(-2 * time.Minute)
	files := map[string]time.Time{
		handoff.SpecFileName(live):       old,
		handoff.SpecFileName(staleOld):   old,
		handoff.SpecFileName(staleYoung): time.Now(),
		"nvidia.com-gpu.json":            old,
		".gpuslice-123.tmp":              old,
		".gpuslice-456.tmp":              time.Now(),
	}
	for name, mtime := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}

	f.alloc.gc(context.Background())
	got := readDirNames(t, dir)
	want := []string{".gpuslice-456.tmp", handoff.SpecFileName(live), handoff.SpecFileName(staleYoung), "nvidia.com-gpu.json"}
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("spec folder after GC (-want +got):\n%s", diff)
	}
	preload, err := os.ReadFile(filepath.Join(f.cfg.EffectiveStateDir(), handoff.PreloadFileName))
	if err != nil || string(preload) != handoff.LibVGPUContainerPath+"\n" {
		t.Errorf("ld.so.preload = %q, %v; want %q", preload, err, handoff.LibVGPUContainerPath+"\n")
	}

	// Without a PodResources answer nothing is removed.
	if err := os.Chtimes(filepath.Join(dir, handoff.SpecFileName(staleYoung)), old, old); err != nil {
		t.Fatal(err)
	}
	f.podRes.fail(codes.Unavailable)
	f.alloc.gc(context.Background())
	if diff := cmp.Diff(want, readDirNames(t, dir)); diff != "" {
		t.Errorf("GC without PodResources removed files (-want +got):\n%s", diff)
	}
}

func TestClaimGC(t *testing.T) {
	path := filepath.Join(t.TempDir(), checkpointFileName)
	s := newClaimStore(path)
	now := time.Now()
	ref := containerRef{Namespace: "default", Pod: "p", Container: "main"}
	mk := func(id string, at time.Time) claim {
		return claim{Device: handoff.DeviceName([]string{id}), DeviceIDs: []string{id}, Ref: ref, PodUID: "uid-p", At: at}
	}
	held, gone, young := mk(DeviceID(gpuA, 0), now.Add(-time.Hour)), mk(DeviceID(gpuA, 1), now.Add(-time.Hour)), mk(DeviceID(gpuA, 2), now)
	for _, c := range []claim{held, gone, young} {
		if err := s.bind(c); err != nil {
			t.Fatal(err)
		}
	}
	s.offer(mk(DeviceID(gpuB, 0), now.Add(-time.Hour)))
	for _, c := range []claim{held, mk(DeviceID(gpuB, 1), now.Add(-time.Hour))} {
		s.hold(c.DeviceIDs, c.At, nil)
	}
	// A first collection that finds the devices unheld (a kubelet that has
	// just restarted lists no pods) drops nothing; one a minute later that
	// still finds them unheld drops them, unless they were held again in
	// between.
	live := map[string]bool{held.Device: true}
	again := mk(DeviceID(gpuB, 2), now.Add(-time.Hour))
	s.hold(again.DeviceIDs, again.At, nil)
	if dropped, err := s.gc(live, now.Add(-time.Minute), now); err != nil || dropped != 0 {
		t.Fatalf("first gc = %d, %v; want nothing dropped", dropped, err)
	}
	live[again.Device] = true
	if dropped, err := s.gc(live, now.Add(-time.Minute+time.Second), now.Add(time.Second)); err != nil || dropped != 0 {
		t.Fatalf("gc once held again = %d, %v; want nothing dropped", dropped, err)
	}
	delete(live, again.Device)
	later := now.Add(time.Minute)
	dropped, err := s.gc(live, later.Add(-time.Minute), later)
	if err != nil || dropped != 2 {
		t.Fatalf("gc a minute later = %d, %v; want 1 binding and 1 holding dropped", dropped, err)
	}
	restored, err := loadClaimStore(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for d := range restored.bindings {
		got = append(got, d)
	}
	slices.Sort(got)
	want := []string{held.Device, young.Device}
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("checkpointed bindings after GC (-want +got):\n%s", diff)
	}
	if _, ok := restored.held(held.Device); !ok || len(restored.holdings) != 2 {
		t.Errorf("checkpointed holdings after GC: %v; want those of %s and %s", restored.holdings, held.Device, again.Device)
	}
	if len(s.offers) != 0 {
		t.Errorf("%d old offers kept", len(s.offers))
	}
}

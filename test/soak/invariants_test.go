package soak

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpuslice/gpuslice/node/handoff"
)

// TestUnusedSpecs: a spec file is in use while a device it defines is, whatever the file's
// name: the plugin keeps one file per set of device IDs and names the devices after their
// holders.
func TestUnusedSpecs(t *testing.T) {
	dir := t.TempDir()
	write := func(file, device string) string {
		spec, err := handoff.BuildSpec(device, handoff.Edits{Env: []handoff.EnvVar{{Name: "A", Value: "1"}}})
		if err == nil {
			_, err = handoff.UpdateSpecFile(dir, file, spec)
		}
		if err != nil {
			t.Fatal(err)
		}
		return filepath.Join(dir, file)
	}
	write(handoff.SpecFileName("vaaa"), "vaaa-0123456789ab")
	stale := write(handoff.SpecFileName("vbbb"), "vbbb-0123456789ab")
	write(handoff.SpecFileName("vccc-0123456789ab"), "vccc-0123456789ab") // a release before's name
	if err := os.WriteFile(filepath.Join(dir, "nvidia.com-gpu.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(maps.Keys(unusedSpecs(dir, map[string]bool{"vaaa-0123456789ab": true, "vccc-0123456789ab": true})))
	if want := []string{stale}; !slices.Equal(got, want) {
		t.Errorf("unused specs = %v, want %v", got, want)
	}
}

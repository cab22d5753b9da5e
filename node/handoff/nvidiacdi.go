package handoff

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/gpuslice/gpuslice/vgpu"
)

// NVIDIACDIDevices finds the NVIDIA container toolkit's CDI device of each
// GPU in the spec files matching patterns (Config.NVIDIACDISpecs, in
// order; the first file that names a GPU wins): the device named by the
// GPU's UUID (nvidia-ctk --device-name-strategy=uuid) or else by its index
// (the default strategy). It returns fully qualified names by UUID; GPUs
// no spec names are left out, and no file at all is not an error. A file
// that matches but cannot be read as a CDI spec is reported beside what
// the other files gave.
func NVIDIACDIDevices(patterns []string, gpus []vgpu.GPU) (map[string]string, error) {
	out := map[string]string{}
	var errs []error
	for _, pattern := range patterns {
		files, err := filepath.Glob(pattern)
		if err != nil {
			errs = append(errs, fmt.Errorf("nvidiaCDISpecs pattern %q: %w", pattern, err))
			continue
		}
		slices.Sort(files)
		for _, file := range files {
			spec, err := cdi.ReadSpec(file, 0)
			if err != nil {
				errs = append(errs, fmt.Errorf("NVIDIA CDI spec %s: %w", file, err))
				continue
			}
			for _, g := range gpus {
				if _, done := out[g.UUID]; done {
					continue
				}
				for _, name := range []string{g.UUID, strconv.Itoa(g.Index)} {
					if spec.GetDevice(name) != nil {
						out[g.UUID] = parser.QualifiedName(spec.GetVendor(), spec.GetClass(), name)
						break
					}
				}
			}
		}
	}
	return out, errors.Join(errs...)
}

// NVIDIADevicesFor returns the NVIDIA CDI devices of gpus (UUIDs) under
// the driver mechanism, or nil when the mechanism is another or a GPU has
// no NVIDIA device (then the plugin's own spec carries the device nodes).
func (a *Builder) NVIDIADevicesFor(gpus []string) []string {
	if a.Enforcement != vgpu.EnforcementDriver || len(a.NVIDIACDI) == 0 {
		return nil
	}
	names := make([]string, 0, len(gpus))
	for _, u := range gpus {
		n, ok := a.NVIDIACDI[u]
		if !ok {
			return nil
		}
		names = append(names, n)
	}
	return names
}

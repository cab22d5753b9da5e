package handoff

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuslice/gpuslice/vgpu"
)

// MemoryLimitHook is the subcommand of the NVIDIA container toolkit's CDI
// hook (nvidia-cdi-hook apply-cuda-memory-limits, toolkit 1.20.1 and later)
// that sets the driver's per-cgroup GPU memory limits from
// EnvGPUMemoryRequest and EnvGPUMemoryLimit. Without it in the toolkit's
// CDI spec nothing applies the driver mechanism's limits.
const MemoryLimitHook = "apply-cuda-memory-limits"

// DriverHook is what the NVIDIA container toolkit's CDI specs offer the
// node's GPUs (DetectDriverHook). The zero value: nothing checked, no hook.
type DriverHook struct {
	// Found says every GPU has a toolkit CDI device whose edits, with its
	// spec's, run MemoryLimitHook.
	Found bool
	// Missing says, for a person, why Found is false; empty when it is
	// true.
	Missing string
	// Devices are the toolkit's CDI devices of the GPUs, fully qualified,
	// by UUID; GPUs no spec names are left out.
	Devices map[string]string
}

// DetectDriverHook reads the NVIDIA container toolkit's CDI spec files
// matching patterns (Config.NVIDIACDISpecs, in order; the first file that
// names a GPU wins) and finds each GPU's device: the one named by its UUID
// (nvidia-ctk --device-name-strategy=uuid) or else by its index (the
// default strategy), and whether the runtime runs MemoryLimitHook for it
// (a hook of the spec or of the device whose arguments name it). No file
// at all is not an error, only no hook. A file that matches but cannot be
// read as a CDI spec is reported beside what the other files gave.
func DetectDriverHook(patterns []string, gpus []vgpu.GPU) (DriverHook, error) {
	out := DriverHook{Devices: map[string]string{}}
	hooked := map[string]bool{}
	var errs []error
	files := 0
	for _, pattern := range patterns {
		matches, err := filepath.Glob(pattern)
		if err != nil {
			errs = append(errs, fmt.Errorf("nvidiaCDISpecs pattern %q: %w", pattern, err))
			continue
		}
		slices.Sort(matches)
		for _, file := range matches {
			spec, err := cdi.ReadSpec(file, 0)
			if err != nil {
				errs = append(errs, fmt.Errorf("NVIDIA CDI spec %s: %w", file, err))
				continue
			}
			files++
			specHook := runsMemoryLimitHook(spec.ContainerEdits.Hooks)
			for _, g := range gpus {
				if _, done := out.Devices[g.UUID]; done {
					continue
				}
				for _, name := range []string{g.UUID, strconv.Itoa(g.Index)} {
					if d := spec.GetDevice(name); d != nil {
						out.Devices[g.UUID] = parser.QualifiedName(spec.GetVendor(), spec.GetClass(), name)
						hooked[g.UUID] = specHook || runsMemoryLimitHook(d.ContainerEdits.Hooks)
						break
					}
				}
			}
		}
	}
	var noDevice, noHook []string
	for _, g := range gpus {
		switch _, ok := out.Devices[g.UUID]; {
		case !ok:
			noDevice = append(noDevice, g.UUID)
		case !hooked[g.UUID]:
			noHook = append(noHook, g.UUID)
		}
	}
	switch {
	case len(gpus) == 0:
		out.Missing = "no GPU to check"
	case files == 0:
		out.Missing = fmt.Sprintf("no NVIDIA container toolkit CDI spec found (nvidiaCDISpecs %s)", strings.Join(patterns, ", "))
	case len(noDevice) > 0:
		out.Missing = fmt.Sprintf("the NVIDIA container toolkit CDI specs name no device for GPU %s", strings.Join(noDevice, ", "))
	case len(noHook) > 0:
		out.Missing = fmt.Sprintf("the NVIDIA container toolkit CDI specs do not run nvidia-cdi-hook %s for GPU %s (the toolkit writes it from 1.20.1 on)", MemoryLimitHook, strings.Join(noHook, ", "))
	default:
		out.Found = true
	}
	return out, errors.Join(errs...)
}

// runsMemoryLimitHook reports whether one of hooks runs MemoryLimitHook.
func runsMemoryLimitHook(hooks []*cdispecs.Hook) bool {
	return slices.ContainsFunc(hooks, func(h *cdispecs.Hook) bool { return h != nil && slices.Contains(h.Args, MemoryLimitHook) })
}

// NVIDIADevicesFor returns the NVIDIA CDI devices of gpus (UUIDs) under
// the driver mechanism, or nil when the mechanism is another or a GPU has
// no NVIDIA device (then the plugin's own spec carries the device nodes;
// only a node on the operator's word, DriverHookAssume, has such GPUs).
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

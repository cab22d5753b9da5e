package nvidia

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/node/handoff"
)

// FakeStateFile is the file in which fake GPUs keep their NVML recovery
// actions (Fake.KeepStateIn), in the faults folder. Its name does not end
// in .json, so ServeFaults leaves it alone.
const FakeStateFile = "fake-gpus.state"

// fakeStateVersion is the version of FakeStateFile written.
const fakeStateVersion = 1

// fakeState is FakeStateFile: the GPUs with a recovery action pending.
type fakeState struct {
	Version int            `json:"version"`
	GPUs    []fakeGPUState `json:"gpus"`
}

// fakeGPUState is one GPU's pending recovery action.
type fakeGPUState struct {
	Index          int                          `json:"index"`
	UUID           string                       `json:"uuid"`
	RecoveryAction nvml.DeviceGpuRecoveryAction `json:"recoveryAction"`
}

// KeepStateIn makes f keep its GPUs' recovery actions in dir/FakeStateFile,
// as real GPUs keep theirs while the plugin restarts: it takes the pending
// actions an earlier Fake on the same folder left there (a GPU counts when
// its index and UUID match), and from then on InjectXID and ResetGPU write
// the file again, atomically, whenever they change an action. So a plugin
// restarted over the same faults folder finds a GPU that needed a reset
// still needing it, until a reset fault file (or ResetGPU) clears it. Call
// it before Open. A missing file means no action pending; a file that
// cannot be read is an error naming it.
func (f *Fake) KeepStateIn(dir string) error {
	path := filepath.Join(dir, FakeStateFile)
	data, err := os.ReadFile(path) //nolint:gosec // G304: the folder the operator named.
	var st fakeState
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("fake GPU state: %w", err)
	default:
		if err := json.Unmarshal(data, &st); err != nil {
			return fmt.Errorf("fake GPU state %s: %w", path, err)
		}
		if st.Version != fakeStateVersion {
			return fmt.Errorf("fake GPU state %s: version %d, want %d", path, st.Version, fakeStateVersion)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range st.GPUs {
		if g.Index >= 0 && g.Index < len(f.devices) && f.devices[g.Index].Device.UUID == g.UUID {
			f.recovery[g.Index] = g.RecoveryAction
		}
	}
	f.stateDir = dir
	return nil
}

// setRecovery sets the recovery action of the GPU at index and, under
// KeepStateIn, writes the state file when it changed. Callers hold f.mu.
func (f *Fake) setRecovery(index int, action nvml.DeviceGpuRecoveryAction) error {
	if f.recovery[index] == action {
		return nil
	}
	f.recovery[index] = action
	if f.stateDir == "" {
		return nil
	}
	st := fakeState{Version: fakeStateVersion, GPUs: []fakeGPUState{}}
	for i, a := range f.recovery {
		if a != nvml.GPU_RECOVERY_ACTION_NONE {
			st.GPUs = append(st.GPUs, fakeGPUState{Index: i, UUID: f.devices[i].Device.UUID, RecoveryAction: a})
		}
	}
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("fake GPU state: %w", err)
	}
	if err := handoff.WriteFileAtomic(f.stateDir, FakeStateFile, append(data, '\n'), 0o600, nil); err != nil {
		return fmt.Errorf("fake GPU state: %w", err)
	}
	return nil
}

package nvidia

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// errResetNotReported means NVML cannot say whether a GPU was reset.
var errResetNotReported = errors.New("NVML does not report the GPU's recovery action on this driver")

// checkReset returns nil when d may turn healthy as far as resets go: its
// fault does not need one, or the GPU went down since the fault (NVML
// reported a recovery action pending, or lost the GPU) and NVML now reports
// no action pending. Otherwise it says what the GPU waits for.
func (w *watcher) checkReset(d *watchedDevice, dev nvml.Device) error {
	w.b.mu.Lock()
	f := w.b.faults[d.uuid]
	w.b.mu.Unlock()
	if !f.resetRequired {
		return nil
	}
	action, err := w.readRecoveryAction(d, dev)
	switch {
	case err != nil:
		return fmt.Errorf("GPU %d needs a reset (%s): %w: %s", d.index, f.reason, err, w.b.manualReset(d.uuid))
	case action != nvml.GPU_RECOVERY_ACTION_NONE:
		return fmt.Errorf("GPU %d needs a reset (%s): NVML reports recovery action %s pending", d.index, f.reason, recoveryActionName(action))
	}
	w.b.mu.Lock()
	down := w.b.faults[d.uuid].downSeen
	w.b.mu.Unlock()
	if !down {
		return fmt.Errorf("GPU %d needs a reset (%s): NVML has neither reported one pending nor lost the GPU since the fault, so nothing shows that it was reset; %s", d.index, f.reason, w.b.manualReset(d.uuid))
	}
	return nil
}

// readRecoveryAction reads dev's GPU recovery action and, when one is
// pending, records on d's fault that the GPU is down for its recovery.
func (w *watcher) readRecoveryAction(d *watchedDevice, dev nvml.Device) (nvml.DeviceGpuRecoveryAction, error) {
	action, err := recoveryAction(dev)
	if err != nil {
		if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
			w.sawDown(d)
		}
		return 0, err
	}
	if action != nvml.GPU_RECOVERY_ACTION_NONE {
		w.sawDown(d)
	}
	return action, nil
}

// sawDown records that d's GPU is down for its recovery (lost, or a
// recovery action pending), when its fault needs a reset.
func (w *watcher) sawDown(d *watchedDevice) {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	if f, ok := w.b.faults[d.uuid]; ok && f.resetRequired {
		f.downSeen = true
		w.b.faults[d.uuid] = f
	}
}

// recoveryAction reads NVML's field nvml.FI_DEV_GET_GPU_RECOVERY_ACTION:
// the action the driver asks for before the GPU serves again (none, a GPU
// reset, a reboot, …). Drivers that do not have the field answer
// errResetNotReported.
func recoveryAction(dev nvml.Device) (nvml.DeviceGpuRecoveryAction, error) {
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := dev.GetFieldValues(values); ret == nvml.ERROR_GPU_IS_LOST {
		return 0, fmt.Errorf("NVML get recovery action: %w", ret)
	} else if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("%w (%w)", errResetNotReported, ret)
	}
	v := values[0]
	if ret := nvml.Return(v.NvmlReturn); ret != nvml.SUCCESS { //nolint:gosec // G115: NVML's return codes are small
		return 0, fmt.Errorf("%w (%w)", errResetNotReported, ret)
	}
	var n uint64
	switch nvml.ValueType(v.ValueType) { //nolint:gosec // G115: NVML's value types are small
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		n = uint64(binary.LittleEndian.Uint32(v.Value[:4]))
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		n = binary.LittleEndian.Uint64(v.Value[:])
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		n = uint64(binary.LittleEndian.Uint16(v.Value[:2]))
	default:
		return 0, fmt.Errorf("%w (value type %d)", errResetNotReported, v.ValueType)
	}
	return nvml.DeviceGpuRecoveryAction(n), nil //nolint:gosec // G115: NVML's enum values are small
}

// recoveryActionName names an NVML GPU recovery action for messages.
func recoveryActionName(a nvml.DeviceGpuRecoveryAction) string {
	switch a {
	case nvml.GPU_RECOVERY_ACTION_NONE:
		return "none"
	case nvml.GPU_RECOVERY_ACTION_GPU_RESET:
		return "GPU reset"
	case nvml.GPU_RECOVERY_ACTION_NODE_REBOOT:
		return "node reboot"
	case nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:
		return "drain peer-to-peer"
	case nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		return "drain and GPU reset"
	case nvml.GPU_RECOVERY_ACTION_BUS_RESET:
		return "bus reset"
	case nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT:
		return "system reboot"
	default:
		return fmt.Sprintf("action %d", int32(a))
	}
}

package nvidia

import (
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// XIDSupport is one GPU's answer to CheckXIDEvents.
type XIDSupport struct {
	// UUID and Index name the GPU.
	UUID  string
	Index int
	// Registered says the GPU accepted a registration for XID events.
	Registered bool
	// Reason says why not, when Registered is false: NVML's error, or
	// that the GPU does not report XID events.
	Reason string
}

// CheckXIDEvents opens an NVML event set of its own, registers every GPU
// for XID critical-error events, waits once for up to wait (an idle GPU
// answers with a timeout, an XID with its event) and frees the set. It
// tells an operator whether WatchHealth can see device faults; it does not
// change health and may run beside WatchHealth. The error is about the
// event set itself (create, wait, free); a GPU that refuses is reported in
// its XIDSupport. Returns ErrClosed after Close.
func (b *Backend) CheckXIDEvents(wait time.Duration) ([]XIDSupport, error) {
	b.life.RLock()
	defer b.life.RUnlock()
	n, err := b.openCount()
	if err != nil {
		return nil, err
	}
	set, ret := b.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML create event set: %w", ret)
	}
	out := make([]XIDSupport, 0, n)
	for i := range n {
		s := XIDSupport{Index: i}
		dev, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret == nvml.SUCCESS {
			s.UUID, ret = dev.GetUUID()
		}
		if ret == nvml.SUCCESS {
			var supported uint64
			supported, ret = dev.GetSupportedEventTypes()
			if ret == nvml.SUCCESS && supported&nvml.EventTypeXidCriticalError == 0 {
				ret = nvml.ERROR_NOT_SUPPORTED
			}
		}
		if ret == nvml.SUCCESS {
			ret = dev.RegisterEvents(nvml.EventTypeXidCriticalError, set)
		}
		s.Registered = ret == nvml.SUCCESS
		if !s.Registered {
			s.Reason = ret.Error()
		}
		out = append(out, s)
	}
	var waitErr error
	if _, ret := set.Wait(uint32(min(wait, maxEventWait).Milliseconds())); ret != nvml.SUCCESS && ret != nvml.ERROR_TIMEOUT { //nolint:gosec // G115: at most maxEventWait.
		waitErr = fmt.Errorf("NVML event wait: %w", ret)
	}
	return out, errors.Join(waitErr, freeSet(set))
}

func freeSet(set nvml.EventSet) error {
	if ret := set.Free(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML free event set: %w", ret)
	}
	return nil
}

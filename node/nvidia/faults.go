package nvidia

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// DefaultFaultScan is how often ServeFaults looks into its folder when
// FaultOptions.Interval is zero.
const DefaultFaultScan = 100 * time.Millisecond

// Suffixes of the files in a fault folder.
const (
	// faultSuffix ends a fault file waiting to be applied.
	faultSuffix = ".json"
	// RejectedSuffix is added to a fault file that cannot be applied (bad
	// JSON, a GPU index out of range): the file stays for the writer to read,
	// and its reason is logged.
	RejectedSuffix = ".rejected"
)

// FakeFault is one fault for the fake GPUs, as a file of the fault folder
// holds it (one JSON object): exactly one of XID, Reset and Activity is set.
type FakeFault struct {
	// GPU is the NVML index of the fake GPU, from 0.
	GPU int `json:"gpu"`
	// XID, when not zero, is delivered as an XID event (InjectXID): an
	// application fault, a recoverable device fault or one that needs a
	// reset, as ClassifyXID says.
	XID uint64 `json:"xid,omitempty"`
	// Reset resets the GPU (ResetGPU), as nvidia-smi --gpu-reset would.
	Reset bool `json:"reset,omitempty"`
	// Activity replaces what runs on the GPU (SetActivity): processes that
	// hold its memory (a container's, once the plugin's procDir maps their
	// PIDs to it) and its utilisation. Not a fault, but the same way in.
	Activity *FakeActivity `json:"activity,omitempty"`
}

// Validate says whether f names one fault.
func (f FakeFault) Validate() error {
	kinds := 0
	for _, set := range []bool{f.XID != 0, f.Reset, f.Activity != nil} {
		if set {
			kinds++
		}
	}
	switch {
	case f.GPU < 0:
		return fmt.Errorf("fault gpu %d: must be a GPU index, 0 or more", f.GPU)
	case kinds != 1:
		return fmt.Errorf(`fault {"gpu": %d, "xid": %d, "reset": %t, "activity": %s}: set exactly one of "xid" (an XID number above 0), "reset" (true) and "activity" (an object)`,
			f.GPU, f.XID, f.Reset, map[bool]string{true: "{…}", false: "null"}[f.Activity != nil])
	case f.Activity != nil && (f.Activity.UtilizationPercent < 0 || f.Activity.UtilizationPercent > 100):
		return fmt.Errorf("fault gpu %d: activity utilizationPercent %d: must be 0 to 100", f.GPU, f.Activity.UtilizationPercent)
	}
	return nil
}

// String names the fault: "XID 48 on GPU 1", "reset of GPU 1" or
// "activity on GPU 1 (2 processes, 60%)".
func (f FakeFault) String() string {
	switch {
	case f.Reset:
		return fmt.Sprintf("reset of GPU %d", f.GPU)
	case f.Activity != nil:
		return fmt.Sprintf("activity on GPU %d (%d processes, %d%%)", f.GPU, len(f.Activity.Processes), f.Activity.UtilizationPercent)
	}
	return fmt.Sprintf("XID %d on GPU %d", f.XID, f.GPU)
}

// WriteFakeFault writes f into the fault folder dir as a new file, atomically
// (a temporary file renamed into place), for a running plugin's ServeFaults
// to apply. Files are applied in name order, and names grow with the time of
// the write, so faults written one after another are applied in that order.
// It returns the file's path: the file is gone once the fault is applied,
// and renamed with RejectedSuffix if it cannot be.
func WriteFakeFault(dir string, f FakeFault) (string, error) {
	if err := f.Validate(); err != nil {
		return "", err
	}
	b, err := json.Marshal(f)
	if err != nil {
		return "", fmt.Errorf("encode fault: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".fault-*.tmp")
	if err != nil {
		return "", fmt.Errorf("write fault: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("write fault: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("write fault: %w", err)
	}
	// The temporary name's random part keeps two writes in one nanosecond apart.
	unique := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(tmp.Name()), ".fault-"), ".tmp")
	path := filepath.Join(dir, fmt.Sprintf("%020d-%s%s", time.Now().UnixNano(), unique, faultSuffix))
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("write fault: %w", err)
	}
	return path, nil
}

// FaultOptions configure ServeFaults. Zero fields take defaults.
type FaultOptions struct {
	// Interval is how often the folder is read; default DefaultFaultScan.
	Interval time.Duration
	// Clock ticks the reads; default the real clock.
	Clock clock.WithTicker
}

// ServeFaults applies the faults written into the folder dir (WriteFakeFault)
// to f until ctx ends, so that a test can break and reset the GPUs of a
// running --fake-gpus plugin from outside its process. It reads the folder
// at once and then every Interval, and applies each "*.json" file in name
// order: an XID is injected, a reset done or the activity set, then the
// file is removed. An
// XID for a GPU no event set watches yet (the health watcher is starting)
// stays in the folder and is tried again at the next read, so a fault
// written while the plugin was down reaches it once it watches. A file that
// cannot be applied gets RejectedSuffix and its reason is logged. Other
// files are left alone. It returns ctx's error, or an error when dir cannot
// be read at the start.
func (f *Fake) ServeFaults(ctx context.Context, dir string, opts FaultOptions) error {
	if opts.Interval <= 0 {
		opts.Interval = DefaultFaultScan
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	logger := klog.FromContext(ctx).WithValues("faultsDir", dir)
	if _, err := os.ReadDir(dir); err != nil {
		return fmt.Errorf("fake GPU faults folder: %w", err)
	}
	t := opts.Clock.NewTicker(opts.Interval)
	defer t.Stop()
	for {
		f.applyFaults(logger, dir)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
		}
	}
}

// applyFaults applies the fault files in dir once, in name order.
func (f *Fake) applyFaults(logger klog.Logger, dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		logger.Error(err, "Cannot read the fake GPU faults folder")
		return
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), faultSuffix) && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, name := range names {
		path := filepath.Join(dir, name)
		fault, err := f.applyFault(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Another reader took it.
		case errors.Is(err, ErrNotWatched):
			logger.V(4).Info("Fake GPU fault waits for the health watcher", "file", name, "fault", fault.String())
		case err != nil:
			logger.Error(err, "Fake GPU fault rejected", "file", name)
			if rerr := os.Rename(path, path+RejectedSuffix); rerr != nil {
				logger.Error(rerr, "Cannot set the rejected fault aside", "file", name)
			}
		default:
			logger.Info("Fake GPU fault applied", "file", name, "fault", fault.String())
			if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				logger.Error(rerr, "Cannot remove the applied fault", "file", name)
			}
		}
	}
}

// applyFault reads the fault file at path and applies it.
func (f *Fake) applyFault(path string) (FakeFault, error) {
	b, err := os.ReadFile(path) //nolint:gosec // G304: a file of the folder the operator named
	if err != nil {
		return FakeFault{}, err
	}
	var fault FakeFault
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fault); err != nil {
		return fault, fmt.Errorf(`fault file %s: %w; want one JSON object {"gpu": INDEX, "xid": N}, {"gpu": INDEX, "reset": true} or {"gpu": INDEX, "activity": {"processes": [{"pid": PID, "memoryMiB": MIB}], "utilizationPercent": P}}`, filepath.Base(path), err)
	}
	if err := fault.Validate(); err != nil {
		return fault, fmt.Errorf("fault file %s: %w", filepath.Base(path), err)
	}
	switch {
	case fault.Reset:
		return fault, f.ResetGPU(fault.GPU)
	case fault.Activity != nil:
		return fault, f.SetActivity(fault.GPU, *fault.Activity)
	}
	return fault, f.InjectXID(fault.GPU, fault.XID)
}

package nvidia

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/node/handoff"
)

const (
	// faultRecordVersion is the version of the fault records written.
	faultRecordVersion = 1
	// faultRecordSuffix ends a fault record's file name, after the GPU's
	// UUID.
	faultRecordSuffix = ".json"
)

// faultRecord is the file Options.FaultRecordDir holds for one GPU that
// needs a reset, <UUID>.json, written atomically and synced to disk when
// the fault begins and when NVML first shows the GPU down for its
// recovery, removed once the GPU is back. A new Backend reads it at Open.
type faultRecord struct {
	Version int    `json:"version"`
	UUID    string `json:"uuid"`
	// XID asked for the reset; 0 when NVML reported a recovery action
	// pending with no XID seen.
	XID uint64 `json:"xid"`
	// NeedsReset is true: only faults that need a reset are recorded.
	NeedsReset bool   `json:"needsReset"`
	Reason     string `json:"reason"`
	// Since is when the GPU began to need the reset.
	Since time.Time `json:"since"`
	// PendingSeen says NVML has, since the fault, reported a recovery
	// action pending for the GPU or lost it (fault.downSeen): NVML reporting
	// no action pending afterwards shows the reset.
	PendingSeen bool `json:"pendingSeen"`
	// BootID is Options.BootID when the record was written.
	BootID string `json:"bootID,omitempty"`
}

// restoreFaults decides, at Open, which GPUs need a reset (restoredFault)
// and holds them unhealthy, writing or removing their records to match.
// A recorded GPU that does not answer (or is gone) keeps its record and is
// held as well.
func (b *Backend) restoreFaults(n int) {
	records := b.readRecords()
	now := b.clock.Now()
	b.mu.Lock()
	for uuid, rec := range records {
		b.records[uuid] = rec
		b.faults[uuid] = fault{reason: rec.Reason, xid: rec.XID, since: rec.Since, resetRequired: true, downSeen: rec.PendingSeen}
	}
	b.mu.Unlock()
	for i := range n {
		dev, uuid, err := b.deviceAt(i)
		if err != nil {
			continue
		}
		rec, recorded := records[uuid]
		var recp *faultRecord
		if recorded {
			recp = &rec
		}
		action, aerr := recoveryAction(dev)
		f, faulty, note := restoredFault(recp, action, aerr, b.bootID)
		if f.since.IsZero() {
			f.since = now
		}
		b.mu.Lock()
		if faulty {
			b.faults[uuid] = f
		} else {
			delete(b.faults, uuid)
		}
		b.mu.Unlock()
		switch {
		case faulty:
			b.logger.Info("GPU needs a reset; unhealthy until NVML shows it was reset", "gpu", uuid, "index", i, "reason", f.reason, "since", f.since, "recorded", recorded, "note", note)
		case recorded:
			b.logger.Info("GPU was reset while the plugin was stopped; back in service", "gpu", uuid, "index", i, "after", rec.Reason, "how", note)
		}
		b.syncRecord(uuid)
	}
}

// restoredFault is what a GPU's fault record (nil: none) and NVML's
// recovery action for it (or the error reading it) say at Open: the fault
// to hold when faulty, and a note on how that was decided. A GPU needs a
// reset while NVML reports an action pending. A recorded GPU has been
// reset when NVML, having shown it down for its recovery (PendingSeen),
// now reports no action pending, or when the node booted since the record
// (bootID, when both are known); else it still needs the reset, however
// long NVML has answered. Pure.
func restoredFault(rec *faultRecord, action nvml.DeviceGpuRecoveryAction, actionErr error, bootID string) (f fault, faulty bool, note string) {
	pending := actionErr == nil && action != nvml.GPU_RECOVERY_ACTION_NONE
	lost := errors.Is(actionErr, nvml.ERROR_GPU_IS_LOST)
	if rec == nil {
		if !pending {
			return fault{}, false, ""
		}
		reason := "NVML reports recovery action " + recoveryActionName(action) + " pending at start"
		return fault{reason: reason, resetRequired: true, downSeen: true}, true, "no record; NVML reports the action pending"
	}
	f = fault{reason: rec.Reason, xid: rec.XID, since: rec.Since, resetRequired: true, downSeen: rec.PendingSeen || pending || lost}
	rebooted := bootID != "" && rec.BootID != "" && rec.BootID != bootID
	switch {
	case pending:
		return f, true, "NVML reports recovery action " + recoveryActionName(action) + " pending"
	case lost:
		return f, true, "NVML reports the GPU lost"
	case rebooted:
		return fault{}, false, "the node booted since the record"
	case actionErr == nil && rec.PendingSeen:
		return fault{}, false, "NVML reported the recovery pending and now reports none"
	case actionErr != nil:
		return f, true, "NVML cannot report the recovery action: " + actionErr.Error()
	}
	return f, true, "NVML never showed the GPU down for a reset since the fault"
}

// readRecords reads every record in b.recordDir, by UUID. A record that
// cannot be read stands for a GPU that needs a reset (its file name gives
// the UUID), so that a damaged file never puts a GPU back into service.
func (b *Backend) readRecords() map[string]faultRecord {
	out := map[string]faultRecord{}
	if b.recordDir == "" {
		return out
	}
	entries, err := os.ReadDir(b.recordDir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			b.logger.Error(err, "Cannot read the GPU fault records; GPUs recorded there may come back before a reset", "dir", b.recordDir)
		}
		return out
	}
	for _, e := range entries {
		uuid, ok := strings.CutSuffix(e.Name(), faultRecordSuffix)
		if !ok || !e.Type().IsRegular() || strings.HasPrefix(uuid, ".") {
			continue
		}
		rec, err := readRecord(filepath.Join(b.recordDir, e.Name()), uuid)
		if err != nil {
			b.logger.Error(err, "GPU fault record unreadable; the GPU is held until it is shown reset", "gpu", uuid)
			rec = faultRecord{Version: faultRecordVersion, UUID: uuid, NeedsReset: true, Reason: err.Error()}
		}
		if rec.NeedsReset {
			out[uuid] = rec
		}
	}
	return out
}

// readRecord reads the record of the GPU uuid at path.
func readRecord(path, uuid string) (faultRecord, error) {
	data, err := os.ReadFile(path) //nolint:gosec // G304: the backend's own folder.
	if err != nil {
		return faultRecord{}, fmt.Errorf("GPU fault record %s: %w", path, err)
	}
	var rec faultRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return faultRecord{}, fmt.Errorf("GPU fault record %s: %w", path, err)
	}
	switch {
	case rec.Version != faultRecordVersion:
		return faultRecord{}, fmt.Errorf("GPU fault record %s: version %d, want %d", path, rec.Version, faultRecordVersion)
	case rec.UUID != uuid:
		return faultRecord{}, fmt.Errorf("GPU fault record %s: names GPU %q", path, rec.UUID)
	}
	return rec, nil
}

// syncRecord makes the record of the GPU uuid match its fault: written
// when it needs a reset, removed when not. It writes only what changed
// since the last read or write. Called by Open and by the watcher's
// goroutine, never at the same time. A failed write is logged: the fault
// still holds in memory.
func (b *Backend) syncRecord(uuid string) {
	if b.recordDir == "" {
		return
	}
	b.mu.Lock()
	f, faulty := b.faults[uuid]
	last, written := b.records[uuid]
	b.mu.Unlock()
	want := faultRecord{}
	if faulty && f.resetRequired {
		want = faultRecord{
			Version: faultRecordVersion, UUID: uuid, XID: f.xid, NeedsReset: true, Reason: f.reason,
			Since: f.since.UTC(), PendingSeen: f.downSeen, BootID: b.bootID,
		}
		if want.BootID == "" && written {
			want.BootID = last.BootID
		}
	}
	if sameRecord(want, last) {
		return
	}
	path := filepath.Join(b.recordDir, uuid+faultRecordSuffix)
	var err error
	if want.NeedsReset {
		err = writeRecord(b.recordDir, want)
	} else if err = os.Remove(path); errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if err != nil {
		b.logger.Error(err, "Cannot update the GPU fault record; a restarted plugin may not know the GPU needs a reset", "gpu", uuid, "file", path)
		return
	}
	b.mu.Lock()
	if want.NeedsReset {
		b.records[uuid] = want
	} else {
		delete(b.records, uuid)
	}
	b.mu.Unlock()
}

// sameRecord reports whether a and b hold the same.
func sameRecord(a, b faultRecord) bool {
	since := a.Since.Equal(b.Since)
	a.Since, b.Since = time.Time{}, time.Time{}
	return since && a == b
}

// writeRecord writes rec into dir durably, creating dir if needed.
func writeRecord(dir string, rec faultRecord) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode GPU fault record: %w", err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("GPU fault records: %w", err)
	}
	return handoff.WriteFileAtomic(dir, rec.UUID+faultRecordSuffix, append(data, '\n'), 0o600, nil)
}

// manualReset says how a person brings back the GPU uuid when NVML cannot
// show its reset.
func (b *Backend) manualReset(uuid string) string {
	if b.recordDir == "" {
		return "restart the plugin once the GPU was reset"
	}
	return "reboot the node, or, once the GPU was reset, remove " + filepath.Join(b.recordDir, uuid+faultRecordSuffix) + " and restart the plugin"
}

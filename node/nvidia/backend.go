package nvidia

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuslice/gpuslice/vgpu"
)

const (
	// DefaultCoolDown is Options.CoolDown when it is left zero.
	DefaultCoolDown = 30 * time.Second
	// DefaultEventWait is Options.EventWait when it is left zero.
	DefaultEventWait = time.Second
	// maxEventWait keeps EventWait within NVML's uint32 milliseconds and
	// WatchHealth's return after ctx ends within reason.
	maxEventWait = time.Minute
)

var (
	// ErrNoDriver means NVML could not start because no NVIDIA driver is
	// installed or loaded on this machine (libnvidia-ml.so.1 is missing or
	// the kernel module is not loaded). Run with fake GPUs instead.
	ErrNoDriver = errors.New("no NVIDIA driver")
	// ErrClosed is returned by calls made after Close.
	ErrClosed = errors.New("NVML backend is closed")
	// ErrAlreadyWatching is returned by WatchHealth while another
	// WatchHealth call on the same Backend is still running.
	ErrAlreadyWatching = errors.New("health is already being watched")
)

// Options configure Open. Zero fields take the defaults named on each field.
type Options struct {
	// Library is the NVML to use. Nil means the system library, nvml.New();
	// tests and --fake-gpus pass a *Fake.
	Library nvml.Interface
	// CoolDown is how long a GPU marked unhealthy by a device fault waits
	// before it is probed again, and again after each failed probe.
	// Default DefaultCoolDown (30s).
	CoolDown time.Duration
	// EventWait is how long one NVML event wait blocks. It bounds how long
	// WatchHealth takes to return after its context ends. Between 1ms and
	// 1m; default DefaultEventWait (1s).
	EventWait time.Duration
	// Clock schedules re-probes. Default: the real clock.
	Clock clock.WithTicker
	// Logger logs what Open, GPUs and Close do; WatchHealth logs to the
	// logger of its context when it has one. Default klog.Background().
	Logger klog.Logger
	// FaultRecordDir is the folder where the backend records each GPU that
	// needs a reset (one file per GPU, faultrecord.go), so that a new
	// Backend on the same folder (the plugin restarted) keeps the GPU out of
	// service until NVML shows it was reset. An absolute path, created when
	// the first record is written; empty keeps no records (the pending
	// recovery action NVML reports at Open still counts).
	FaultRecordDir string
	// BootID identifies the node's current boot (the kernel's
	// /proc/sys/kernel/random/boot_id): a record written under another boot
	// is cleared, since a reboot resets every GPU. Empty: unknown, no record
	// is cleared for it.
	BootID string
}

// Validate reports the first field of o that is out of range. Zero values
// are valid: they take defaults.
func (o Options) Validate() error {
	if o.CoolDown < 0 {
		return fmt.Errorf("option CoolDown %v: must not be negative", o.CoolDown)
	}
	if o.EventWait < 0 || (o.EventWait > 0 && o.EventWait < time.Millisecond) || o.EventWait > maxEventWait {
		return fmt.Errorf("option EventWait %v: must be 0 (default %v) or between 1ms and %v", o.EventWait, DefaultEventWait, maxEventWait)
	}
	if o.FaultRecordDir != "" && !filepath.IsAbs(o.FaultRecordDir) {
		return fmt.Errorf("option FaultRecordDir %q: must be empty or an absolute path", o.FaultRecordDir)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Library == nil {
		o.Library = nvml.New()
	}
	if o.CoolDown == 0 {
		o.CoolDown = DefaultCoolDown
	}
	if o.EventWait == 0 {
		o.EventWait = DefaultEventWait
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = klog.Background()
	}
	return o
}

// Backend is the NVML view of one node's GPUs. It satisfies the device
// plugin's GPUBackend. GPUs may be called from any goroutine; at most one
// WatchHealth runs at a time. Create it with Open and end it with Close.
type Backend struct {
	lib       nvml.Interface
	coolDown  time.Duration
	eventWait time.Duration
	clock     clock.WithTicker
	logger    klog.Logger
	// hasNUMA says the loaded library exports nvmlDeviceGetNumaNodeId;
	// calling a missing symbol would kill the process.
	hasNUMA bool
	// recordDir and bootID are Options.FaultRecordDir and Options.BootID.
	recordDir string
	bootID    string

	// life guards closed: NVML calls outside WatchHealth hold it for
	// reading, Close takes it for writing.
	life     sync.RWMutex
	closed   bool
	watching bool
	closing  context.Context
	cancel   context.CancelFunc
	watchers sync.WaitGroup

	// mu guards known, faults, records and xids, shared by GPUs, Usage and
	// WatchHealth.
	mu sync.Mutex
	// known is the last record GPUs read successfully, by NVML index.
	known map[int]vgpu.GPU
	// faults holds the unhealthy GPUs, by UUID.
	faults map[string]fault
	// xids counts the XIDs seen, by GPU UUID and XID (XIDCounts).
	xids map[string]map[uint64]uint64
	// records are the fault records in recordDir as last read or written,
	// by GPU UUID (syncRecord).
	records map[string]faultRecord
}

// fault is why a GPU is unhealthy.
type fault struct {
	// reason is the latest fault, as the health event says it.
	reason string
	// xid is the XID that asked for a reset; 0 for other faults, and for
	// a recovery action found pending at Open without a record.
	xid uint64
	// since is when the GPU first needed a reset; zero for other faults.
	since time.Time
	// resetRequired says an XID whose action is a reset or a reboot
	// (ResetRequired) hit the GPU: answering NVML is not enough to bring it
	// back.
	resetRequired bool
	// downSeen says NVML has, since then, reported a recovery action
	// pending for the GPU or lost it: it went down for its recovery, and
	// counts as reset once it answers again with no action pending.
	downSeen bool
}

// Open starts NVML and returns a Backend over it. When Init fails, Open
// returns at once without calling NVML again; the error wraps ErrNoDriver
// when no driver is installed or loaded, and the nvml.Return in every case.
//
// Before it returns, Open holds out of service every GPU that needs a
// reset: one for which NVML reports a recovery action pending, and one
// recorded in Options.FaultRecordDir that NVML does not show reset since
// (restoreFaults). GPUs reports them Unhealthy from the first call, and
// WatchHealth probes them as it probes any GPU it left unhealthy.
func Open(opts Options) (*Backend, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("NVML backend options: %w", err)
	}
	opts = opts.withDefaults()
	if ret := opts.Library.Init(); ret != nvml.SUCCESS {
		// Nothing else may be called on the library now, not even Shutdown.
		return nil, newInitError(ret)
	}
	b := &Backend{
		lib:       opts.Library,
		coolDown:  opts.CoolDown,
		eventWait: opts.EventWait,
		clock:     opts.Clock,
		logger:    opts.Logger,
		recordDir: opts.FaultRecordDir,
		bootID:    opts.BootID,
		known:     map[int]vgpu.GPU{},
		faults:    map[string]fault{},
		xids:      map[string]map[uint64]uint64{},
		records:   map[string]faultRecord{},
	}
	b.closing, b.cancel = context.WithCancel(context.Background())
	if ext := opts.Library.Extensions(); ext != nil {
		b.hasNUMA = ext.LookupSymbol("nvmlDeviceGetNumaNodeId") == nil
	}
	n, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		err := fmt.Errorf("NVML device count: %w", ret)
		if sret := b.lib.Shutdown(); sret != nvml.SUCCESS {
			err = errors.Join(err, fmt.Errorf("NVML shutdown: %w", sret))
		}
		return nil, err
	}
	b.logger.Info("NVML started", "gpus", n, "numaQuery", b.hasNUMA)
	b.restoreFaults(n)
	return b, nil
}

// Close stops every running WatchHealth, waits for them to return, and
// shuts NVML down. It is idempotent: later calls return nil. Calls made
// after Close return ErrClosed.
func (b *Backend) Close() error {
	b.life.Lock()
	if b.closed {
		b.life.Unlock()
		return nil
	}
	b.closed = true
	b.life.Unlock()

	b.cancel()
	b.watchers.Wait()
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML shutdown: %w", ret)
	}
	return nil
}

// startWatch registers a WatchHealth call; endWatch undoes it.
func (b *Backend) startWatch() error {
	b.life.Lock()
	defer b.life.Unlock()
	switch {
	case b.closed:
		return ErrClosed
	case b.watching:
		return ErrAlreadyWatching
	}
	b.watching = true
	b.watchers.Add(1)
	return nil
}

func (b *Backend) endWatch() {
	b.life.Lock()
	b.watching = false
	b.life.Unlock()
	b.watchers.Done()
}

// initError is a failed nvml.Init with a hint a user can act on.
type initError struct {
	ret      nvml.Return
	hint     string
	noDriver bool
}

func newInitError(ret nvml.Return) *initError {
	e := &initError{ret: ret}
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		e.noDriver = true
		e.hint = "libnvidia-ml.so.1 not found (is the NVIDIA driver installed? use --fake-gpus to run without a GPU)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		e.noDriver = true
		e.hint = "the NVIDIA kernel driver is not loaded (use --fake-gpus to run without a GPU)"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		e.hint = "libnvidia-ml.so.1 does not match the loaded kernel driver (reboot or reload the driver)"
	case nvml.ERROR_NO_PERMISSION:
		e.hint = "no permission to open the NVIDIA device files"
	default:
		e.hint = "unexpected NVML error"
	}
	return e
}

func (e *initError) Error() string {
	return "NVML init failed: " + e.hint + ": " + e.ret.Error()
}

// Unwrap lets errors.Is find ErrNoDriver (when it applies) and the
// nvml.Return.
func (e *initError) Unwrap() []error {
	if e.noDriver {
		return []error{ErrNoDriver, e.ret}
	}
	return []error{e.ret}
}

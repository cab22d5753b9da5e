package nvidia

import (
	"fmt"
	"maps"
	"slices"
)

// XIDKind is what an XID does to a GPU's health, after the recovery action
// NVIDIA's XID catalogue gives it.
type XIDKind int

const (
	// ApplicationFault is an XID whose immediate action is to restart the
	// application, or none (RESTART_APP, IGNORE, an application workflow):
	// the driver has torn the offending context down and the GPU keeps
	// serving other work. The GPU stays healthy.
	ApplicationFault XIDKind = iota + 1
	// DeviceFault is a recoverable device fault (a check of power or links,
	// or an XID the catalogue does not list): the GPU is unhealthy until it
	// answers a re-probe after the cool-down.
	DeviceFault
	// ResetRequired is an XID whose immediate action is a GPU reset or a
	// reboot (RESET_GPU, RESTART_BM, RESTART_VM, WORKFLOW_XID_48). NVML
	// still answers after most of them, so answering proves nothing: the
	// GPU stays unhealthy until NVML shows it was reset (see WatchHealth),
	// or the plugin starts again after the reset.
	ResetRequired
)

// String returns "application fault", "device fault" or "reset required".
func (k XIDKind) String() string {
	switch k {
	case ApplicationFault:
		return "application fault"
	case DeviceFault:
		return "device fault"
	case ResetRequired:
		return "reset required"
	default:
		return fmt.Sprintf("XIDKind(%d)", int(k))
	}
}

// XIDClass is what one XID means to the health watcher.
type XIDClass struct {
	// Kind says what the XID does to the GPU's health.
	Kind XIDKind
	// Action is the catalogue's immediate action ("RESTART_APP",
	// "RESET_GPU", "RESTART_BM", …), or "" for an unlisted XID.
	Action string
	// Description is NVIDIA's short name for the XID, or "unlisted XID"
	// for one not in the table.
	Description string
	// Reboot says the action is a reboot of the machine (RESTART_BM,
	// RESTART_VM) rather than a GPU reset; both are ResetRequired.
	Reboot bool
}

// The catalogue's immediate actions gpuslice names.
const (
	actionRestartApp = "RESTART_APP"
	actionIgnore     = "IGNORE"
	actionResetGPU   = "RESET_GPU"
	actionRestartBM  = "RESTART_BM"
	actionRestartVM  = "RESTART_VM"
)

// xidTable is the one list of the XIDs gpuslice knows, with the immediate
// action ("Resolution Bucket (Immediate Action)") of NVIDIA's XID
// catalogue for Ampere and newer GPUs
// (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).
// docs/health.md shows the same table; a test keeps the two equal.
var xidTable = map[uint64]XIDClass{
	8:   app(actionRestartApp, "GPU stopped processing"),
	11:  app(actionRestartApp, "invalid or corrupted push buffer stream"),
	13:  app(actionRestartApp, "graphics engine exception"),
	31:  app(actionRestartApp, "GPU memory page fault"),
	32:  app(actionRestartApp, "invalid or corrupted push buffer stream (PBDMA)"),
	38:  app(actionIgnore, "driver firmware watchdog timeout"),
	43:  app(actionIgnore, "GPU stopped processing (application channel reset)"),
	45:  app("WORKFLOW_XID_45", "preemptive cleanup after previous errors"),
	63:  app(actionIgnore, "ECC page retirement or row remapping event"),
	68:  app(actionRestartApp, "video processor (NVDEC) exception"),
	69:  app(actionRestartApp, "graphics engine class error"),
	92:  app(actionIgnore, "high single-bit ECC error rate"),
	94:  app(actionRestartApp, "contained ECC error"),
	154: app("follow the XID before it", "GPU recovery action changed"),

	54: {Kind: DeviceFault, Action: "CHECK_MECHANICALS", Description: "auxiliary power is not connected"},
	74: {Kind: DeviceFault, Action: "WORKFLOW_NVLINK_ERR", Description: "NVLink error"},

	46:  reset(actionResetGPU, "GPU timeout"),
	48:  reset("WORKFLOW_XID_48", "double-bit ECC error"),
	62:  reset(actionResetGPU, "internal micro-controller halt"),
	64:  reset(actionResetGPU, "ECC page retirement or row remapping failure"),
	95:  reset(actionResetGPU, "uncontained ECC error"),
	109: reset(actionResetGPU, "context switch timeout"),
	110: reset(actionResetGPU, "security fault"),
	119: reset(actionResetGPU, "GSP RPC timeout"),
	120: reset(actionResetGPU, "GSP error"),
	136: reset(actionResetGPU, "link training failure"),
	140: reset(actionResetGPU, "unrecovered ECC error"),
	143: reset(actionResetGPU, "GPU initialization failure"),
	155: reset(actionResetGPU, "NVLink software-defined error"),
	156: reset(actionResetGPU, "resource retirement event"),
	158: reset(actionResetGPU, "GPU fatal timeout"),

	79:  reboot(actionRestartBM, "GPU has fallen off the bus"),
	151: reboot(actionRestartVM, "key rotation error"),
	160: reboot(actionRestartBM, "channel retirement event"),
}

func app(action, description string) XIDClass {
	return XIDClass{Kind: ApplicationFault, Action: action, Description: description}
}

func reset(action, description string) XIDClass {
	return XIDClass{Kind: ResetRequired, Action: action, Description: description}
}

func reboot(action, description string) XIDClass {
	return XIDClass{Kind: ResetRequired, Action: action, Description: description, Reboot: true}
}

// ClassifyXID says what an XID does to a GPU's health (XIDKind), with the
// catalogue's immediate action and NVIDIA's short description.
//
// An XID missing from the table is a recoverable DeviceFault. NVIDIA's
// device plugin does the same (every XID outside its skip list is fatal)
// for a sound reason: taking a good GPU out of service wrongly costs one
// cool-down here, because it is re-probed and comes back, while keeping a
// broken GPU in service fails every pod placed on it with nothing to tell
// the scheduler.
func ClassifyXID(xid uint64) XIDClass {
	if c, ok := xidTable[xid]; ok {
		return c
	}
	return XIDClass{Kind: DeviceFault, Description: "unlisted XID"}
}

// KnownXIDs returns the XIDs of the table, in increasing order.
func KnownXIDs() []uint64 {
	return slices.Sorted(maps.Keys(xidTable))
}

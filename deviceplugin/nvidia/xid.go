package nvidia

import "fmt"

// XIDKind says who caused an XID: the application on the GPU or the GPU
// (with its driver, memory, bus or links).
type XIDKind int

const (
	// ApplicationFault is an XID a faulty or killed application causes; the
	// GPU keeps working for other applications and stays healthy.
	ApplicationFault XIDKind = iota + 1
	// DeviceFault is an XID that leaves the GPU unfit for new work until it
	// answers a re-probe (often after a reset); it marks the GPU unhealthy.
	DeviceFault
)

// String returns "application fault" or "device fault".
func (k XIDKind) String() string {
	switch k {
	case ApplicationFault:
		return "application fault"
	case DeviceFault:
		return "device fault"
	default:
		return fmt.Sprintf("XIDKind(%d)", int(k))
	}
}

// XIDClass is what one XID means to the health watcher.
type XIDClass struct {
	// Kind says whether the XID makes the GPU unhealthy.
	Kind XIDKind
	// Description is NVIDIA's short name for the XID, or "unlisted XID"
	// for one not in the table.
	Description string
}

// xidTable lists the XIDs gpuslice knows, after NVIDIA's XID catalogue
// (docs.nvidia.com/deploy/xid-errors). The application faults are the XIDs
// NVIDIA's k8s-device-plugin skips by default (13, 31, 43, 45, 68, 109): the
// driver has already torn the offending context down and the GPU serves
// other work. The device faults are listed for their descriptions; any XID
// missing here is a device fault too (see ClassifyXID).
var xidTable = map[uint64]XIDClass{
	13:  {ApplicationFault, "graphics engine exception"},
	31:  {ApplicationFault, "GPU memory page fault"},
	43:  {ApplicationFault, "GPU stopped processing (application channel reset)"},
	45:  {ApplicationFault, "preemptive cleanup after previous errors"},
	68:  {ApplicationFault, "video processor (NVDEC) exception"},
	109: {ApplicationFault, "context switch timeout"},

	32:  {DeviceFault, "invalid or corrupted push buffer stream (PCIe or system memory)"},
	38:  {DeviceFault, "driver firmware error"},
	48:  {DeviceFault, "double-bit ECC error"},
	54:  {DeviceFault, "auxiliary power is not connected"},
	62:  {DeviceFault, "internal micro-controller halt"},
	63:  {DeviceFault, "ECC page retirement or row remapping event"},
	64:  {DeviceFault, "ECC page retirement or row remapping failure"},
	74:  {DeviceFault, "NVLink error"},
	79:  {DeviceFault, "GPU has fallen off the bus"},
	92:  {DeviceFault, "high single-bit ECC error rate"},
	94:  {DeviceFault, "contained ECC error"},
	95:  {DeviceFault, "uncontained ECC error"},
	119: {DeviceFault, "GSP RPC timeout"},
	120: {DeviceFault, "GSP error"},
	140: {DeviceFault, "unrecovered ECC error"},
}

// ClassifyXID says whether an XID is an application fault (the GPU stays
// healthy) or a device fault (the GPU becomes unhealthy until it answers a
// re-probe), with NVIDIA's short description.
//
// An XID missing from the table is a device fault. NVIDIA's device plugin
// does the same (every XID outside its skip list is fatal) for a sound
// reason: taking a good GPU out of service wrongly costs one CoolDown here,
// because it is re-probed and comes back, while keeping a broken GPU in
// service fails every pod placed on it with nothing to tell the scheduler.
func ClassifyXID(xid uint64) XIDClass {
	if c, ok := xidTable[xid]; ok {
		return c
	}
	return XIDClass{Kind: DeviceFault, Description: "unlisted XID"}
}

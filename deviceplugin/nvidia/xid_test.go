package nvidia

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestClassifyXID(t *testing.T) {
	tests := []struct {
		xid  uint64
		want XIDClass
	}{
		{13, XIDClass{ApplicationFault, "graphics engine exception"}},
		{31, XIDClass{ApplicationFault, "GPU memory page fault"}},
		{43, XIDClass{ApplicationFault, "GPU stopped processing (application channel reset)"}},
		{45, XIDClass{ApplicationFault, "preemptive cleanup after previous errors"}},
		{68, XIDClass{ApplicationFault, "video processor (NVDEC) exception"}},
		{109, XIDClass{ApplicationFault, "context switch timeout"}},
		{48, XIDClass{DeviceFault, "double-bit ECC error"}},
		{63, XIDClass{DeviceFault, "ECC page retirement or row remapping event"}},
		{64, XIDClass{DeviceFault, "ECC page retirement or row remapping failure"}},
		{74, XIDClass{DeviceFault, "NVLink error"}},
		{79, XIDClass{DeviceFault, "GPU has fallen off the bus"}},
		{92, XIDClass{DeviceFault, "high single-bit ECC error rate"}},
		{94, XIDClass{DeviceFault, "contained ECC error"}},
		{95, XIDClass{DeviceFault, "uncontained ECC error"}},
		{119, XIDClass{DeviceFault, "GSP RPC timeout"}},
		{0, XIDClass{DeviceFault, "unlisted XID"}},
		{999, XIDClass{DeviceFault, "unlisted XID"}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.xid), func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ClassifyXID(tc.xid)); diff != "" {
				t.Errorf("ClassifyXID(%d) (-want +got):\n%s", tc.xid, diff)
			}
		})
	}
}

func TestXIDKindString(t *testing.T) {
	for kind, want := range map[XIDKind]string{ApplicationFault: "application fault", DeviceFault: "device fault", 0: "XIDKind(0)"} {
		if got := kind.String(); got != want {
			t.Errorf("XIDKind(%d).String() = %q, want %q", int(kind), got, want)
		}
	}
}

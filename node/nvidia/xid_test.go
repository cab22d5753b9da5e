package nvidia

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestClassifyXID(t *testing.T) {
	tests := []struct {
		xid  uint64
		want XIDClass
	}{
		{13, XIDClass{Kind: ApplicationFault, Action: "RESTART_APP", Description: "graphics engine exception"}},
		{31, XIDClass{Kind: ApplicationFault, Action: "RESTART_APP", Description: "GPU memory page fault"}},
		{43, XIDClass{Kind: ApplicationFault, Action: "IGNORE", Description: "GPU stopped processing (application channel reset)"}},
		{63, XIDClass{Kind: ApplicationFault, Action: "IGNORE", Description: "ECC page retirement or row remapping event"}},
		{94, XIDClass{Kind: ApplicationFault, Action: "RESTART_APP", Description: "contained ECC error"}},
		{74, XIDClass{Kind: DeviceFault, Action: "WORKFLOW_NVLINK_ERR", Description: "NVLink error"}},
		{48, XIDClass{Kind: ResetRequired, Action: "WORKFLOW_XID_48", Description: "double-bit ECC error"}},
		{64, XIDClass{Kind: ResetRequired, Action: "RESET_GPU", Description: "ECC page retirement or row remapping failure"}},
		{95, XIDClass{Kind: ResetRequired, Action: "RESET_GPU", Description: "uncontained ECC error"}},
		{109, XIDClass{Kind: ResetRequired, Action: "RESET_GPU", Description: "context switch timeout"}},
		{119, XIDClass{Kind: ResetRequired, Action: "RESET_GPU", Description: "GSP RPC timeout"}},
		{120, XIDClass{Kind: ResetRequired, Action: "RESET_GPU", Description: "GSP error"}},
		{79, XIDClass{Kind: ResetRequired, Action: "RESTART_BM", Description: "GPU has fallen off the bus", Reboot: true}},
		{0, XIDClass{Kind: DeviceFault, Description: "unlisted XID"}},
		{999, XIDClass{Kind: DeviceFault, Description: "unlisted XID"}},
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
	for kind, want := range map[XIDKind]string{ApplicationFault: "application fault", DeviceFault: "device fault", ResetRequired: "reset required", 0: "XIDKind(0)"} {
		if got := kind.String(); got != want {
			t.Errorf("XIDKind(%d).String() = %q, want %q", int(kind), got, want)
		}
	}
}

// xidDoc is the page that shows the XID table, between xidDocBegin and
// xidDocEnd.
const (
	xidDoc      = "../../docs/health.md"
	xidDocBegin = "<!-- xid-table: generated from node/nvidia/xid.go; TestXIDTableInDocs checks it -->\n"
	xidDocEnd   = "<!-- /xid-table -->"
)

// TestXIDTableInDocs keeps the table in docs/health.md equal to xidTable:
// the code is the one place, the page shows it.
func TestXIDTableInDocs(t *testing.T) {
	data, err := os.ReadFile(xidDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), xidDocBegin)
	got, _, ok2 := strings.Cut(rest, xidDocEnd)
	if !ok || !ok2 {
		t.Fatalf("%s: no table between %q and %q", xidDoc, xidDocBegin, xidDocEnd)
	}
	var b strings.Builder
	b.WriteString("| XID | NVIDIA's description | immediate action (XID catalogue) | gpuslice |\n|---|---|---|---|\n")
	for _, xid := range KnownXIDs() {
		c := ClassifyXID(xid)
		effect := map[XIDKind]string{
			ApplicationFault: "stays healthy",
			DeviceFault:      "unhealthy until it answers a re-probe",
			ResetRequired:    "unhealthy until NVML shows it was reset",
		}[c.Kind]
		fmt.Fprintf(&b, "| %d | %s | `%s` | %s |\n", xid, c.Description, c.Action, effect)
	}
	b.WriteString("| any other | unlisted XID | — | unhealthy until it answers a re-probe |\n")
	if diff := cmp.Diff(b.String(), got); diff != "" {
		t.Errorf("%s: XID table differs from xidTable (-want +got):\n%s\nwant:\n%s", xidDoc, diff, b.String())
	}
}

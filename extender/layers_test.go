package extender

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLayers checks the import graph that keeps the packages under
// extender below its adapter: none reaches an API clientset or the
// extender package itself, and none imports net/http (which k8s.io/api
// reaches anyway, so only direct imports count). A package in the table
// that does not exist yet is skipped.
func TestLayers(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("listing imports needs the go command: %v", err)
	}
	const module = "github.com/gpuslice/gpuslice/"
	// Patterns as go list takes them: "/..." matches the tree below too.
	// k8s.io/client-go/rest is what every clientset talks through.
	never := []string{"k8s.io/client-go/kubernetes/...", "k8s.io/client-go/rest", module + "extender"}
	direct := []string{"net/http/..."}
	tests := []struct {
		dir string
		// never are further patterns the package must not reach.
		never []string
	}{
		{dir: "retry"},
		{dir: "drascore"},
		{dir: "cluster", never: []string{module + "extender/retry"}},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			if _, err := os.Stat(tt.dir); errors.Is(err, fs.ErrNotExist) {
				t.Skipf("no package extender/%s yet", tt.dir)
			}
			// One line per package: its path, and for the listed
			// package itself its direct imports after it.
			out, err := exec.Command(goTool, "list", "-deps", "-f",
				`{{.ImportPath}}{{if not .DepOnly}}{{range .Imports}} {{.}}{{end}}{{end}}`, "./"+tt.dir).Output()
			if err != nil {
				t.Fatalf("go list -deps ./%s: %v", tt.dir, err)
			}
			var got []string
			for line := range strings.Lines(string(out)) {
				fields := strings.Fields(line)
				if matchesAny(append(never, tt.never...), fields[0]) {
					got = append(got, "reaches "+fields[0])
				}
				for _, imp := range fields[1:] {
					if matchesAny(direct, imp) {
						got = append(got, "imports "+imp)
					}
				}
			}
			if diff := cmp.Diff([]string(nil), got); diff != "" {
				t.Errorf("extender/%s depends on what it must not (-want +got):\n%s", tt.dir, diff)
			}
		})
	}
}

// matchesAny reports whether path matches one of patterns, where a
// pattern ending in "/..." matches its stem and every path below it.
func matchesAny(patterns []string, path string) bool {
	for _, p := range patterns {
		stem, tree := strings.CutSuffix(p, "/...")
		if path == stem || tree && strings.HasPrefix(path, stem+"/") {
			return true
		}
	}
	return false
}

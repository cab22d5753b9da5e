package extender

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/extender/cluster"
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

// TestStateLockPrivate checks that only extender/cluster takes its
// state's lock: State exports no field (its lock is one of them), and no
// code outside the package but tests calls State.Stall, the one method
// that holds the lock across a return.
func TestStateLockPrivate(t *testing.T) {
	typ := reflect.TypeFor[cluster.State]()
	for f := range typ.Fields() {
		if f.IsExported() {
			t.Errorf("cluster.State exports field %s", f.Name)
		}
	}
	roots := []string{".", "../internal", "../cmd"}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
			switch {
			case err != nil:
				return err
			case e.IsDir() && (e.Name() == "cluster" || e.Name() == "testdata"):
				return filepath.SkipDir
			case e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
				return nil
			}
			src, err := os.ReadFile(path) //nolint:gosec // the repository's own tree
			if err != nil {
				return err
			}
			if strings.Contains(string(src), ".Stall()") {
				t.Errorf("%s holds the cluster state's lock (Stall): only tests may", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

package chart

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the current chart")

const (
	valuesDir = "testdata/values"
	goldenDir = "testdata/golden"
	// certPlaceholder replaces the CA and serving certificate the chart generates on every render
	// (genCA, genSignedCert), so that golden files are stable.
	certPlaceholder = "<generated certificate>"
	// checksumPlaceholder replaces a checksum/* annotation whose value changes between two
	// renders of the same values: one that covers a generated certificate.
	checksumPlaceholder = "<checksum of generated certificate>"
)

var (
	// certField matches a line holding generated certificate data: the Secret's keys and the
	// webhook's caBundle.
	certField = regexp.MustCompile(`(?m)^(\s+(?:ca\.crt|tls\.crt|tls\.key|caBundle): )(\S+)$`)
	// checksumField matches a checksum/* annotation.
	checksumField = regexp.MustCompile(`(?m)^(\s+checksum/[^:\s]+: )(\S+)$`)
)

// valuesCase is one values file of testdata/values and its golden render.
type valuesCase struct {
	name   string // file name without .yaml
	values string
	golden string
}

// valuesCases lists testdata/values/*.yaml, sorted by name.
func valuesCases(t *testing.T) []valuesCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(filepath.FromSlash(valuesDir), "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no values files in %s", valuesDir)
	}
	sort.Strings(files)
	cases := make([]valuesCase, 0, len(files))
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		cases = append(cases, valuesCase{name: name, values: f, golden: filepath.Join(filepath.FromSlash(goldenDir), name+".yaml")})
	}
	return cases
}

// TestChartGolden renders the chart for every values file in testdata/values, lints it, compares
// the render with its golden file (generated certificates masked) and checks the render's
// invariants and component configurations. Run with -update to rewrite the golden files.
func TestChartGolden(t *testing.T) {
	h := requireHelm(t)
	meta, err := readChartMeta()
	if err != nil {
		t.Fatal(err)
	}
	cases := valuesCases(t)
	checkNoStaleGoldens(t, cases)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if _, err := h.lint(c.values); err != nil {
				t.Errorf("helm lint --strict (warnings fail too): %v", err)
			}
			first, err := h.template(c.values)
			if err != nil {
				t.Fatal(err)
			}
			second, err := h.template(c.values)
			if err != nil {
				t.Fatal(err)
			}
			got, err := maskGenerated(string(first), string(second))
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, c.golden, got)

			objs, err := parseRender(first)
			if err != nil {
				t.Fatalf("parse the render: %v", err)
			}
			checkInvariants(t, meta, rendered{objs: objs})
			checkComponentConfigs(t, rendered{objs: objs})
		})
	}
}

// checkNoStaleGoldens fails t for a golden file without a values file.
func checkNoStaleGoldens(t *testing.T, cases []valuesCase) {
	t.Helper()
	want := make(map[string]bool, len(cases))
	for _, c := range cases {
		want[filepath.Base(c.golden)] = true
	}
	entries, err := os.ReadDir(filepath.FromSlash(goldenDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !want[e.Name()] {
			t.Errorf("%s/%s has no values file %s/%s: delete it or add the values", goldenDir, e.Name(), valuesDir, e.Name())
		}
	}
}

// maskGenerated returns the first render with the generated certificates and the checksums that
// cover them replaced by placeholders. A checksum is masked when it differs between the two
// renders of the same values; any other difference between them is an error, since a render
// must not change from one run to the next.
func maskGenerated(first, second string) (string, error) {
	a := certField.ReplaceAllString(first, "${1}"+certPlaceholder)
	b := certField.ReplaceAllString(second, "${1}"+certPlaceholder)
	sumsA := checksumField.FindAllStringSubmatch(a, -1)
	sumsB := checksumField.FindAllStringSubmatch(b, -1)
	if len(sumsA) != len(sumsB) {
		return "", errors.New("two renders of the same values have different checksum annotations")
	}
	mask := func(sums [][]string) func(string) string {
		i := 0
		return func(line string) string {
			defer func() { i++ }()
			if sumsA[i][2] != sumsB[i][2] {
				return sums[i][1] + checksumPlaceholder
			}
			return line
		}
	}
	a = checksumField.ReplaceAllStringFunc(a, mask(sumsA))
	b = checksumField.ReplaceAllStringFunc(b, mask(sumsB))
	if diff := cmp.Diff(a, b); diff != "" {
		return "", errors.New("two renders of the same values differ beyond the generated certificates (-first +second):\n" + diff)
	}
	return a, nil
}

// checkGolden compares got with the golden file at path, or rewrites it with -update.
func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil { //nolint:gosec // G301: a checked-in test folder.
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil { //nolint:gosec // G306: a checked-in test file.
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./chart/ -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("render differs from %s (-want +got); if the change is intended, run go test ./chart/ -update:\n%s", path, diff)
	}
}

package findup

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDir: the nearest parent's folder wins, one without the file is passed over, and nothing
// found is false without an error.
func TestDir(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "a", "b", "c")
	for _, d := range []string{deep, filepath.Join(root, "out", "bin"), filepath.Join(root, "a", "out", "bin")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	// root/out/bin has the file; root/a/out/bin, nearer, does not.
	if err := os.WriteFile(filepath.Join(root, "out", "bin", "tool"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(deep)
	got, ok, err := Dir(filepath.Join("out", "bin"), Has("tool"))
	if err != nil || !ok || got != filepath.Join(root, "out", "bin") {
		t.Errorf("Dir(out/bin, Has(tool)) = %q, %t, %v; want %s", got, ok, err, filepath.Join(root, "out", "bin"))
	}
	got, ok, err = Dir(filepath.Join("out", "bin"), Has())
	if err != nil || !ok || got != filepath.Join(root, "a", "out", "bin") {
		t.Errorf("Dir(out/bin, Has()) = %q, %t, %v; want the nearer %s", got, ok, err, filepath.Join(root, "a", "out", "bin"))
	}
	if got, ok, err := Dir("nowhere", Has()); err != nil || ok {
		t.Errorf("Dir(nowhere) = %q, %t, %v; want not found", got, ok, err)
	}
}

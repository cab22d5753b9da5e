// Package findup finds a folder of the repository from wherever a test or tool runs: rel below
// the working directory or the nearest of its parents that has it.
package findup

import (
	"fmt"
	"os"
	"path/filepath"
)

// Dir returns filepath.Join(d, rel) for the working directory d or the nearest of its parents
// for which holds accepts it, and false when none does.
func Dir(rel string, holds func(dir string) bool) (string, bool, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false, fmt.Errorf("find %s: %w", rel, err)
	}
	for {
		if candidate := filepath.Join(dir, rel); holds(candidate) {
			return candidate, true, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false, nil
		}
		dir = parent
	}
}

// Has returns a holds function for Dir that accepts a folder that exists with every one of files
// in it.
func Has(files ...string) func(dir string) bool {
	return func(dir string) bool {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return false
		}
		for _, f := range files {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				return false
			}
		}
		return true
	}
}

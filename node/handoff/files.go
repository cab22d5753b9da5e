package handoff

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Temporary files of WriteFileAtomic are named tempPrefix*tempSuffix, so
// that neither CDI (which reads *.json and *.yaml) nor the kubelet (which
// deletes sockets only) ever looks at them, and GC can find leftovers.
const (
	tempPrefix = ".gpuslice-"
	tempSuffix = ".tmp"
)

// WriteFileAtomic replaces dir/name with data so that a reader sees either
// the old or the new file, never a part: it writes a temporary file in dir,
// syncs it, runs check on its path (nil: no check; an error stops the
// write), renames it over name and syncs dir. The temporary file is
// removed on any failure. Safe for concurrent use on different names; for
// one name the last rename wins.
func WriteFileAtomic(dir, name string, data []byte, perm os.FileMode, check func(path string) error) (err error) {
	f, err := os.CreateTemp(dir, tempPrefix+"*"+tempSuffix)
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, perm)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
	}
	if check != nil {
		if err = check(tmp); err != nil {
			return err
		}
	}
	if err = os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir) //nolint:gosec // G304: the plugin's own folder.
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// EnsureFile writes dir/name with content unless it already holds exactly
// that, creating dir if needed.
func EnsureFile(dir, name, content string, perm os.FileMode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // G301: container runtimes bind-mount files from here.
		return fmt.Errorf("create %s: %w", dir, err)
	}
	old, err := os.ReadFile(filepath.Join(dir, name)) //nolint:gosec // G304: the plugin's own file.
	if err == nil && string(old) == content {
		return nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s: %w", filepath.Join(dir, name), err)
	}
	return WriteFileAtomic(dir, name, []byte(content), perm, nil)
}

// RemoveStaleTemps deletes WriteFileAtomic leftovers in dir (from a crash
// between create and rename) last modified before cutoff.
func RemoveStaleTemps(dir string, cutoff time.Time) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tempPrefix) || !strings.HasSuffix(e.Name(), tempSuffix) {
			continue
		}
		if info, err := e.Info(); err == nil && info.ModTime().Before(cutoff) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

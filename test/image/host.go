package image

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"strings"
)

// HostFile returns the file, folder or link at hostPath of this machine as an entry at imagePath,
// with its permission bits.
func HostFile(hostPath, imagePath string) (File, error) {
	fi, err := os.Lstat(hostPath)
	if err != nil {
		return File{}, fmt.Errorf("image file %s: %w", imagePath, err)
	}
	f := File{Path: imagePath, Mode: fi.Mode().Perm()}
	switch {
	case fi.IsDir():
		f.Dir = true
	case fi.Mode()&fs.ModeSymlink != 0:
		if f.Link, err = os.Readlink(hostPath); err != nil {
			return File{}, fmt.Errorf("image file %s: %w", imagePath, err)
		}
	case fi.Mode().IsRegular():
		if f.Data, err = os.ReadFile(hostPath); err != nil { //nolint:gosec // G304: the image's inputs, named by its recipe
			return File{}, fmt.Errorf("image file %s: %w", imagePath, err)
		}
	default:
		return File{}, fmt.Errorf("image file %s: %s is neither a file, a folder nor a link", imagePath, hostPath)
	}
	return f, nil
}

// skipped are the parts of a distribution package an image has no use for.
var skipped = []string{"/usr/share/doc/", "/usr/share/man/", "/usr/share/lintian/", "/usr/share/locale/", "/usr/share/info/", "/usr/share/initramfs-tools/"}

// Packages returns a layer with the files of the installed Debian packages names (as dpkg-query -L
// lists them), at the same paths, without documentation. It fails when a package is not installed
// (install it with apt-get) or dpkg-query is missing.
func Packages(names ...string) (Layer, error) {
	var l Layer
	for _, name := range names {
		var stderr bytes.Buffer
		cmd := exec.Command("dpkg-query", "-L", name) //nolint:gosec // G204: package names of the image recipe
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("files of package %s (apt-get install %s): %w: %s", name, name, err, strings.TrimSpace(stderr.String()))
		}
		for _, p := range strings.Split(string(out), "\n") {
			p = path.Clean(strings.TrimSpace(p))
			if p == "/" || p == "." || !path.IsAbs(p) || isSkipped(p) {
				continue
			}
			if fi, err := os.Stat(p); err == nil && fi.IsDir() {
				// A folder, or a link to one on a merged-/usr host: a folder in the image.
				l = append(l, File{Path: p, Dir: true, Mode: fi.Mode().Perm()})
				continue
			}
			f, err := HostFile(p, p)
			if err != nil {
				return nil, fmt.Errorf("package %s: %w", name, err)
			}
			l = append(l, f)
		}
	}
	return l, nil
}

// isSkipped reports whether p is documentation that Packages leaves out.
func isSkipped(p string) bool {
	for _, s := range skipped {
		if strings.HasPrefix(p+"/", s) {
			return true
		}
	}
	return false
}

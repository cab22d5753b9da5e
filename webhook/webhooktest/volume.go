package webhooktest

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// File names in a SecretVolume, as in a kubernetes.io/tls Secret.
const (
	CertName = "tls.crt"
	KeyName  = "tls.key"
)

// SecretVolume is a folder laid out and updated the way the kubelet
// maintains a Secret volume: the files live in a hidden, timestamped folder,
// a "..data" symlink points at it, and tls.crt and tls.key are symlinks
// through "..data". An update writes a new hidden folder and swaps "..data"
// with one rename, so readers see the old pair or the new one, never a mix.
// Its methods are safe for concurrent use.
type SecretVolume struct {
	dir string

	mu       sync.Mutex
	versions int
}

// NewSecretVolume returns an empty SecretVolume in a new t.TempDir().
func NewSecretVolume(t testing.TB) *SecretVolume {
	t.Helper()
	return &SecretVolume{dir: t.TempDir()}
}

// CertFile is the path of tls.crt.
func (v *SecretVolume) CertFile() string { return filepath.Join(v.dir, CertName) }

// KeyFile is the path of tls.key.
func (v *SecretVolume) KeyFile() string { return filepath.Join(v.dir, KeyName) }

// Write puts pair in the volume atomically, failing t on error.
func (v *SecretVolume) Write(t testing.TB, pair KeyPair) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.versions++
	version := "..v" + strconv.Itoa(v.versions)
	fail := func(err error) {
		t.Helper()
		t.Fatalf("webhooktest: write secret volume: %v", err)
	}
	if err := os.Mkdir(filepath.Join(v.dir, version), 0o700); err != nil {
		fail(err)
	}
	for name, data := range map[string][]byte{CertName: pair.CertPEM, KeyName: pair.KeyPEM} {
		if err := os.WriteFile(filepath.Join(v.dir, version, name), data, 0o600); err != nil {
			fail(err)
		}
	}
	dataLink := filepath.Join(v.dir, "..data")
	old, _ := os.Readlink(dataLink)
	if err := os.Symlink(version, filepath.Join(v.dir, "..data_tmp")); err != nil {
		fail(err)
	}
	if err := os.Rename(filepath.Join(v.dir, "..data_tmp"), dataLink); err != nil {
		fail(err)
	}
	for _, name := range []string{CertName, KeyName} {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			fail(err)
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, old)); err != nil {
			fail(err)
		}
	}
}

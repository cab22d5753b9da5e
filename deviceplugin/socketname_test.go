package deviceplugin

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// TestSocketNamesNeverRepeat: two plugins of one configuration, as a
// plugin and its restart in a container (both PID 1), name their sockets
// apart in every round; the kubelet's device manager refuses a socket path
// it still counts connected, for good once it has dropped both clients.
func TestSocketNamesNeverRepeat(t *testing.T) {
	cfg := validConfig()
	seen := map[string]int{}
	for i := range 2 {
		p, err := New(cfg, staticBackend{gpus: testGPUs()}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for round := 1; round <= 3; round++ {
			name := p.socketName(round)
			if !strings.HasPrefix(name, "gpuslice-hami_io_gpu-") || !strings.HasSuffix(name, ".sock") {
				t.Errorf("plugin %d round %d: socket name %q, want gpuslice-hami_io_gpu-….sock", i, round, name)
			}
			if j, ok := seen[name]; ok {
				t.Errorf("plugin %d round %d: socket name %q repeats plugin %d's", i, round, name, j)
			}
			seen[name] = i
		}
	}
}

// TestRemoveDeadSockets: a socket of the resource's prefix that nothing
// listens on goes; one that answers, one of another prefix and a plain
// file of the prefix stay.
func TestRemoveDeadSockets(t *testing.T) {
	dir, err := os.MkdirTemp("", "sock") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	listen := func(name string, keep bool) string {
		path := filepath.Join(dir, name)
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		if keep {
			t.Cleanup(func() { _ = ln.Close() })
			return path
		}
		ln.SetUnlinkOnClose(false) // as a killed process leaves it
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	dead := listen("gpuslice-hami_io_gpu-0a1b2c3d-1.sock", false)
	alive := listen("gpuslice-hami_io_gpu-4e5f6a7b-1.sock", true)
	other := listen("gpuslice-example_com_gpu-0a1b2c3d-1.sock", false)
	plain := filepath.Join(dir, "gpuslice-hami_io_gpu-notes.sock")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	removeDeadSockets(ktesting.NewLogger(t, ktesting.DefaultConfig), dir, "gpuslice-hami_io_gpu-")

	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dead socket of the prefix: %v, want it removed", err)
	}
	for _, kept := range []string{alive, other, plain} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s: %v, want it kept", filepath.Base(kept), err)
		}
	}
}

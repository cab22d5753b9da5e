package kubeletstate

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// sampleCDIDevice is the CDI device of sample's first container.
const sampleCDIDevice = "gpuslice.io/vgpu=v00000000000000000001-0123456789ab"

// sample is a device manager checkpoint as a kubelet writes it (taken from
// a node of the local cluster, shortened): two containers of one resource,
// one of another resource, a device on two NUMA nodes; the first
// container's Allocate answer names one CDI device, the others' are empty
// or do not decode.
const sample = `{"Data":{"PodDeviceEntries":[` +
	`{"PodUID":"uid-a","ContainerName":"main","ResourceName":"hami.io/gpu","DeviceIDs":{"-1":["GPU-1::4"]},"AllocResp":"KjUKM2dwdXNsaWNlLmlvL3ZncHU9djAwMDAwMDAwMDAwMDAwMDAwMDAxLTAxMjM0NTY3ODlhYg=="},` +
	`{"PodUID":"uid-b","ContainerName":"side","ResourceName":"hami.io/gpu","DeviceIDs":{"0":["GPU-1::5","GPU-2::0"],"1":["GPU-2::0"]},"AllocResp":""},` +
	`{"PodUID":"uid-c","ContainerName":"main","ResourceName":"example.com/other","DeviceIDs":{"-1":["GPU-1::6"]},"AllocResp":"KjU="}` +
	`],"RegisteredDevices":{"hami.io/gpu":["GPU-1::4","GPU-1::5","GPU-1::6","GPU-2::0"]}},"Checksum":1234567890}`

func writeCheckpoint(t *testing.T, content string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, CheckpointFile), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestDeviceHolder(t *testing.T) {
	dir := writeCheckpoint(t, sample)
	for _, tc := range []struct {
		name     string
		resource string
		ids      []string
		want     Holder
		wantErr  error
	}{
		{"one device", "hami.io/gpu", []string{"GPU-1::4"}, Holder{PodUID: "uid-a", Container: "main", CDIDevices: []string{sampleCDIDevice}}, nil},
		{"devices in another order, one on two NUMA nodes", "hami.io/gpu", []string{"GPU-2::0", "GPU-1::5"}, Holder{PodUID: "uid-b", Container: "side"}, nil},
		{"part of a container's devices", "hami.io/gpu", []string{"GPU-1::5"}, Holder{}, ErrNoHolder},
		{"more than a container's devices", "hami.io/gpu", []string{"GPU-1::4", "GPU-1::5"}, Holder{}, ErrNoHolder},
		{"another resource's devices", "hami.io/gpu", []string{"GPU-1::6"}, Holder{}, ErrNoHolder},
		{"no devices", "hami.io/gpu", nil, Holder{}, ErrNoHolder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DeviceHolder(dir, tc.resource, tc.ids)
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("DeviceHolder(%v) error = %v, want %v", tc.ids, err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("DeviceHolder(%v) (-want +got):\n%s", tc.ids, diff)
			}
		})
	}
}

// TestDeviceHolderTwoHolders: a checkpoint that gives the same devices to
// two containers (which a kubelet never writes) answers nothing.
func TestDeviceHolderTwoHolders(t *testing.T) {
	dir := writeCheckpoint(t, `{"Data":{"PodDeviceEntries":[`+
		`{"PodUID":"uid-a","ContainerName":"main","ResourceName":"r","DeviceIDs":{"-1":["d1"]}},`+
		`{"PodUID":"uid-b","ContainerName":"main","ResourceName":"r","DeviceIDs":{"-1":["d1"]}}]}}`)
	if got, err := DeviceHolder(dir, "r", []string{"d1"}); !errors.Is(err, ErrNoHolder) {
		t.Errorf("DeviceHolder = %+v, %v; want ErrNoHolder", got, err)
	}
}

// TestDeviceHolderUnreadable: no checkpoint, or one in another format,
// answers nothing, with an error saying why.
func TestDeviceHolderUnreadable(t *testing.T) {
	if _, err := DeviceHolder(t.TempDir(), "r", []string{"d1"}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("without a checkpoint: %v, want one wrapping fs.ErrNotExist", err)
	}
	for _, content := range []string{"", "not json", `{"Data":{"PodDeviceEntries":{"a":1}}}`, `{"Data":{"PodDeviceEntries":[{"DeviceIDs":["d1"]}]}}`} {
		if got, err := DeviceHolder(writeCheckpoint(t, content), "r", []string{"d1"}); err == nil {
			t.Errorf("checkpoint %q: got %+v, want an error", content, got)
		}
	}
}

// TestRead: each entry with its devices sorted and each once, a device on
// two NUMA nodes included, and the CDI devices of its Allocate answer
// where the answer decodes.
func TestRead(t *testing.T) {
	got, err := Read(writeCheckpoint(t, sample))
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{PodUID: "uid-a", Container: "main", Resource: "hami.io/gpu", DeviceIDs: []string{"GPU-1::4"}, CDIDevices: []string{sampleCDIDevice}},
		{PodUID: "uid-b", Container: "side", Resource: "hami.io/gpu", DeviceIDs: []string{"GPU-1::5", "GPU-2::0"}},
		{PodUID: "uid-c", Container: "main", Resource: "example.com/other", DeviceIDs: []string{"GPU-1::6"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Read (-want +got):\n%s", diff)
	}
}

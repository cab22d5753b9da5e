package kubeletstate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpuslice/gpuslice/internal/fuzzcost"
)

// maxAllocsPerByte bounds what reading a checkpoint costs: heap allocations
// per byte of the file, beyond readAllocs. A JSON string costs at least 3
// bytes ("",) and one allocation, a NUMA node's list a key, a slice and a
// string; anything growing faster than the file is a defect, whatever the
// machine's speed.
const (
	maxAllocsPerByte = 1
	readAllocs       = 64 // opening and reading the file, the empty result
)

// fuzzCheckpoints seeds FuzzRead: the kubelet's own layout (sample), its
// edge cases, and files no kubelet writes.
var fuzzCheckpoints = []string{
	sample,
	`{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{}},"Checksum":0}`,
	`{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":{"0":["d","d"],"1":["d"],"-1":[]}}]}}`,
	`{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":{}}]}}`,
	`{"data":{"poddeviceentries":[{"poduid":"case"}]}}`,
	`{"Data":{"PodDeviceEntries":[{"PodUID":"a"}],"PodDeviceEntries":[{}]}}`,
	"{\"Data\":{\"PodDeviceEntries\":[{\"DeviceIDs\":{\"0\":[\"\u00e9\\ufffd\xff\"]}}]}}",
	"", "null", "[]", `"x"`, "{", `{"Data":1}`, `{"Data":{"PodDeviceEntries":{"a":1}}}`,
	`{"Data":{"PodDeviceEntries":[{"DeviceIDs":["d1"]}]}}`, `{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"0":"d"}}]}}`,
	strings.Repeat(`[`, 10000), `{"Data":{"PodDeviceEntries":[` + strings.Repeat(`{"DeviceIDs":{"0":["d"]}},`, 200) + `{}]}}`,
}

// FuzzRead reads any file as the kubelet's device checkpoint. Properties: no panic; a file that
// is not JSON is an error; each entry's devices are sorted and each once; the entries, written
// back in the kubelet's layout, read as the same entries; what it returns holds no more than
// three bytes of text per byte of the file (the JSON decoder turns a byte of invalid UTF-8 into
// U+FFFD); and the allocations stay within maxAllocsPerByte.
func FuzzRead(f *testing.F) {
	for _, s := range fuzzCheckpoints {
		f.Add([]byte(s))
	}
	dir, again := f.TempDir(), f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		write(t, dir, data)
		entries, err := Read(dir)
		if !json.Valid(data) && err == nil {
			t.Fatalf("Read(%q) = %+v, want an error: the file is not JSON", data, entries)
		}
		if err != nil {
			return
		}
		text := 0
		for _, e := range entries {
			if !slices.IsSorted(e.DeviceIDs) || len(slices.Compact(slices.Clone(e.DeviceIDs))) != len(e.DeviceIDs) {
				t.Fatalf("Read(%q): entry %+v: devices not sorted, or repeated", data, e)
			}
			text += len(e.PodUID) + len(e.Container) + len(e.Resource)
			for _, id := range e.DeviceIDs {
				text += len(id)
			}
			for _, name := range e.CDIDevices {
				text += len(name)
			}
		}
		if text > 3*len(data) {
			t.Fatalf("Read(%q): %d bytes of text from a %d-byte file", data, text, len(data))
		}
		write(t, again, encode(t, entries))
		back, err := Read(again)
		if err != nil || !reflect.DeepEqual(nilIfEmpty(back), nilIfEmpty(entries)) {
			t.Fatalf("Read(%q) = %+v; written back and read again: %+v, %v", data, entries, back, err)
		}
		fuzzcost.Check(t, "Read", len(data), readAllocs, maxAllocsPerByte, func() { _, _ = Read(dir) })
	})
}

// write makes data the checkpoint in dir.
func write(t *testing.T, dir string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, CheckpointFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// encode writes entries in the kubelet's layout, each device under NUMA node -1 and the CDI
// devices in an Allocate answer of their own.
func encode(t *testing.T, entries []Entry) []byte {
	t.Helper()
	type entry struct {
		PodUID        string
		ContainerName string
		ResourceName  string
		DeviceIDs     map[string][]string
		AllocResp     []byte
	}
	var cp struct {
		Data struct{ PodDeviceEntries []entry }
	}
	for _, e := range entries {
		var alloc []byte
		for _, name := range e.CDIDevices {
			device := protowire.AppendTag(nil, fieldCDIName, protowire.BytesType)
			device = protowire.AppendString(device, name)
			alloc = protowire.AppendTag(alloc, fieldCDIDevices, protowire.BytesType)
			alloc = protowire.AppendBytes(alloc, device)
		}
		cp.Data.PodDeviceEntries = append(cp.Data.PodDeviceEntries, entry{e.PodUID, e.Container, e.Resource, map[string][]string{"-1": e.DeviceIDs}, alloc})
	}
	data, err := json.Marshal(cp)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// nilIfEmpty makes the device and CDI lists of entries nil when empty: the kubelet's layout
// does not tell an empty list from none.
func nilIfEmpty(entries []Entry) []Entry {
	out := slices.Clone(entries)
	for i := range out {
		if len(out[i].DeviceIDs) == 0 {
			out[i].DeviceIDs = nil
		}
		if len(out[i].CDIDevices) == 0 {
			out[i].CDIDevices = nil
		}
	}
	return out
}

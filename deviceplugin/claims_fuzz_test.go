package deviceplugin

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/internal/fuzzcost"
	"github.com/gpuslice/gpuslice/node/handoff"
)

// Bounds of FuzzLoadClaimStore. A checkpoint entry is kept only under the key of its device IDs
// ("v" and 20 hex digits, quoted: minEntryBytes); loading costs a few allocations per JSON value
// (0.3 per byte measured on the seeds and the fuzzer's finds) beyond opening and reading the file.
const (
	minEntryBytes         = 23
	claimsAllocsPerByte   = 1
	claimsReadAllocs      = 64
	maxReencodedPerEntry  = 512 // the fields of one entry, indented, with a holder name and a time
	maxReencodedPerByte   = 6   // a byte of text encoded as \u00XX
	maxReencodedOverheads = 64
)

// fuzzClaimCheckpoints returns FuzzLoadClaimStore's seeds: a checkpoint as the store writes it
// (a binding, a holding prepared for a container, one not yet), and files the store never writes.
func fuzzClaimCheckpoints(f *testing.F) []string {
	at := time.Date(2026, 3, 1, 12, 0, 0, 123, time.FixedZone("x", 3600))
	s := newClaimStore(filepath.Join(f.TempDir(), checkpointFileName))
	ref := containerRef{Namespace: "default", Pod: "p", Container: "main"}
	bound := []string{DeviceID(gpuA, 0), DeviceID(gpuB, 1)}
	s.bindings[handoff.DeviceName(bound)] = claim{Device: handoff.DeviceName(bound), DeviceIDs: bound, Ref: ref, PodUID: "uid-1", At: at}
	for i, owner := range []*specOwner{{Ref: ref, PodUID: "uid-2"}, nil} {
		ids := []string{DeviceID(gpuA, 2+i)}
		key := handoff.DeviceName(ids)
		s.holdings[key] = holding{Device: key, DeviceIDs: ids, Name: handoff.HolderName(key, "0123456789ab"), At: at, For: owner}
	}
	if err := s.save(true); err != nil {
		f.Fatal(err)
	}
	written, err := os.ReadFile(s.path)
	if err != nil {
		f.Fatal(err)
	}
	if loaded, err := loadClaimStore(s.path); err != nil || !bytes.Equal(encodeStore(f, loaded), written) {
		f.Fatalf("save wrote %s; loaded (%v) and encoded as FuzzLoadClaimStore does, it is not the same", written, err)
	}
	key := handoff.DeviceName(nil)
	return []string{
		string(written),
		`{"version":1,"bindings":[]}`,
		`{"version":1,"bindings":null,"holdings":null}`,
		`{"version":1,"bindings":[{"device":"` + key + `"},{"device":"` + key + `","at":"9999-12-31T23:59:59-23:59"}]}`,
		`{"version":1,"holdings":[{"device":"` + key + `","cdiDevice":"` + key + `-t","preparedFor":{"container":{"namespace":"n","pod":"p","container":"c"},"podUID":"u"}}]}`,
		`{"VERSION":1,"Bindings":[{"DEVICE":"` + key + `"}]}`,
		`{"version":2,"bindings":[]}`, `{"version":1,"bindings":[{"device":"v0"}]}`,
		`{"version":1,"holdings":[{"device":"` + key + `","cdiDevice":"` + key + `"}]}`,
		`{"version":1,"holdings":[{"device":"` + key + `","cdiDevice":"` + key + `-t","preparedFor":{}}]}`,
		`{"version":1,"bindings":[{"device":"` + key + `","at":"yesterday"}]}`,
		"", "null", "{", "[]", `{"version":"1"}`, strings.Repeat(`{"a":`, 5000),
	}
}

// FuzzLoadClaimStore loads any file as the plugin's claims checkpoint. Properties: no panic; a
// file that is not JSON is an error; an error leaves the store empty; every entry kept is under
// the key of its device IDs, with a holder name of that key; the store encoded again (as save
// does) loads as the same store and encodes to the same bytes; the entries and the file written back are
// bounded by the file's size; the allocations stay within claimsAllocsPerByte.
func FuzzLoadClaimStore(f *testing.F) {
	for _, s := range fuzzClaimCheckpoints(f) {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	path, again := filepath.Join(dir, checkpointFileName), filepath.Join(dir, "again.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := loadClaimStore(path)
		if !json.Valid(data) && err == nil {
			t.Fatalf("loadClaimStore(%q) accepted a file that is not JSON", data)
		}
		entries := len(s.bindings) + len(s.holdings)
		if err != nil {
			if entries != 0 {
				t.Fatalf("loadClaimStore(%q) = %v with %d entries, want none", data, err, entries)
			}
			return
		}
		for key, c := range s.bindings {
			if key != c.Device || key != handoff.DeviceName(c.DeviceIDs) {
				t.Fatalf("loadClaimStore(%q): binding %+v under %q", data, c, key)
			}
		}
		for key, h := range s.holdings {
			if key != h.Device || key != handoff.DeviceName(h.DeviceIDs) || !handoff.IsHolderName(h.Name, key) {
				t.Fatalf("loadClaimStore(%q): holding %+v under %q", data, h, key)
			}
		}
		if entries > len(data)/minEntryBytes {
			t.Fatalf("loadClaimStore(%q): %d entries from %d bytes", data, entries, len(data))
		}

		written := encodeStore(t, s)
		if limit := maxReencodedPerByte*len(data) + maxReencodedPerEntry*entries + maxReencodedOverheads; len(written) > limit {
			t.Fatalf("loadClaimStore(%q), encoded again: %d bytes, want at most %d", data, len(written), limit)
		}
		if err := os.WriteFile(again, written, 0o600); err != nil {
			t.Fatal(err)
		}
		back, err := loadClaimStore(again)
		if err != nil {
			t.Fatalf("loadClaimStore(%q), encode, load: %v", data, err)
		}
		if diff := cmp.Diff(s.bindings, back.bindings); diff != "" {
			t.Fatalf("loadClaimStore(%q), encode, load: bindings (-first +again):\n%s", data, diff)
		}
		if diff := cmp.Diff(s.holdings, back.holdings); diff != "" {
			t.Fatalf("loadClaimStore(%q), encode, load: holdings (-first +again):\n%s", data, diff)
		}
		if twice := encodeStore(t, back); !bytes.Equal(twice, written) {
			t.Fatalf("loadClaimStore(%q): encoded twice, the results differ:\n%s\n%s", data, written, twice)
		}
		fuzzcost.Check(t, "loadClaimStore", len(data), claimsReadAllocs, claimsAllocsPerByte, func() { _, _ = loadClaimStore(path) })
	})
}

// encodeStore encodes s as save writes it (the checkpoint type, entries in key order, indented),
// without save's two fsyncs, which on a busy disk held the fuzzer to a few inputs a second and
// tripped its 10-second limit per input. The seeds are files save itself wrote.
func encodeStore(t testing.TB, s *claimStore) []byte {
	t.Helper()
	cp := checkpoint{Version: checkpointVersion}
	for _, key := range slices.Sorted(maps.Keys(s.bindings)) {
		cp.Bindings = append(cp.Bindings, s.bindings[key])
	}
	for _, key := range slices.Sorted(maps.Keys(s.holdings)) {
		cp.Holdings = append(cp.Holdings, s.holdings[key])
	}
	data, err := json.MarshalIndent(cp, "", "  ")
	if err != nil {
		t.Fatalf("encode %+v: %v", cp, err)
	}
	return data
}

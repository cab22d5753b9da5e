package handoff

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/gpuslice/gpuslice/internal/fuzzcost"
)

// Bounds of FuzzSpecDevices: reading a spec costs a few allocations per JSON value (under 0.3
// per byte measured on the seeds and the fuzzer's finds) beyond opening and reading the file.
const (
	specAllocsPerByte = 1
	specReadAllocs    = 64
)

// fuzzEdits are the edits of the seeds' specs: what a container on a real GPU gets.
var fuzzEdits = Edits{
	Env: []EnvVar{
		{Name: "NVIDIA_VISIBLE_DEVICES", Value: "GPU-1"}, {Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "10240m"},
		{Name: "GPUSLICE_POD", Value: "default/train"},
	},
	Mounts:      []HostMount{{HostPath: "/var/lib/gpuslice/vgpu/libvgpu.so", ContainerPath: "/usr/local/vgpu/libvgpu.so"}},
	DeviceNodes: []string{"/dev/nvidia0", "/dev/nvidiactl"},
}

// fuzzSpecs returns FuzzSpecDevices' seeds: specs the plugin writes, a spec of two devices as
// another vendor writes them, and files that are no spec.
func fuzzSpecs(f *testing.F) []string {
	key := DeviceName([]string{"GPU-1::0"})
	var out []string
	for _, name := range []string{key, HolderName(key, "0123456789ab")} {
		spec, err := BuildSpec(name, fuzzEdits)
		if err != nil {
			f.Fatal(err)
		}
		data, err := encodeSpec(spec)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, string(data))
	}
	return append(out,
		`{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}},{"name":"all","containerEdits":{}}],"containerEdits":{"env":["A=b"]}}`,
		`{"cdiVersion":"0.3.0","kind":"gpuslice.io/vgpu","devices":[]}`,
		`{"cdiVersion":"0.3.0","kind":"gpuslice.io/vgpu","devices":[{"name":"a"},{"name":"a"}]}`,
		`{"cdiVersion":"0.3.0","kind":"gpuslice.io/vgpu","DEVICES":[{"NAME":"a"}]}`,
		`{"devices":[{"name":"a"}],"devices":[{"name":"b"}]}`,
		`{"devices":[{"name":"\u00e9\ud83d"}]}`,
		"", "null", "{", "[]", `{"devices":{}}`, `{"devices":[{"name":1}]}`, "cdiVersion: 0.3.0\nkind: gpuslice.io/vgpu\ndevices: [{name: a}]\n",
		strings.Repeat(`{"devices":[`, 3000),
	)
}

// FuzzSpecDevices reads any file as a CDI spec. Properties: no panic; a file that is not JSON
// is an error; a file the CDI library itself reads and accepts (what a container runtime does)
// gives the same device names, in order; the names hold no more than three bytes per byte of the
// file (invalid UTF-8 becomes U+FFFD); SpecDefines agrees with SpecDevices; the allocations stay
// within specAllocsPerByte.
func FuzzSpecDevices(f *testing.F) {
	for _, s := range fuzzSpecs(f) {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	const file = "fuzz.json"
	path := filepath.Join(dir, file)
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		names, err := SpecDevices(path)
		if !json.Valid(data) && err == nil {
			t.Fatalf("SpecDevices(%q) = %q, want an error: the file is not JSON", data, names)
		}
		if spec, cdiErr := cdi.ReadSpec(path, 0); cdiErr == nil {
			var want []string
			for _, d := range spec.Devices {
				want = append(want, d.Name)
			}
			if err != nil || !slices.Equal(names, want) {
				t.Fatalf("SpecDevices(%q) = %q, %v; the CDI library reads devices %q", data, names, err, want)
			}
		}
		text := 0
		for _, n := range names {
			text += len(n)
		}
		if text > 3*len(data) {
			t.Fatalf("SpecDevices(%q): %d bytes of names from a %d-byte file", data, text, len(data))
		}
		for _, n := range append(slices.Clone(names), "other") {
			if got, want := SpecDefines(dir, file, n), err != nil || slices.Contains(names, n); got != want {
				t.Fatalf("SpecDefines(%q) of %q = %t, want %t (SpecDevices: %q, %v)", n, data, got, want, names, err)
			}
		}
		fuzzcost.Check(t, "SpecDevices", len(data), specReadAllocs, specAllocsPerByte, func() { _, _ = SpecDevices(path) })
	})
}

// FuzzBuildSpec builds the spec of any device name with any value in the environment, as the
// plugin writes it (WriteSpec's encoding, encodeSpec, without its fsyncs), and reads it back. Properties:
// BuildSpec refuses exactly the names CDI refuses; the spec it builds is one the CDI library
// accepts, holding that one device with the value unchanged (when it is UTF-8: JSON has nothing
// else); SpecDevices reads the name back, and the spec file's name (SpecFileName) gives the name
// back through DeviceOfFile.
func FuzzBuildSpec(f *testing.F) {
	key := DeviceName([]string{"GPU-1::0", "GPU-2::3"})
	for _, s := range []struct{ name, value string }{
		{key, "default/train"}, {HolderName(key, "0123456789ab"), "ml/p-0"}, {"a", ""},
		{"", "x"}, {"a/b", "x"}, {"-a", "x"}, {"a=b", "x"}, {key, "a=b\n\x00\t'\""}, {key, "\xff"}, {key, "\x7f\u0085\u009f\uffff"},
		{strings.Repeat("a", 300), strings.Repeat("v", 5000)},
	} {
		f.Add(s.name, s.value)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, name, value string) {
		edits := fuzzEdits
		edits.Env = append(slices.Clone(edits.Env), EnvVar{Name: "GPUSLICE_FUZZ", Value: value})
		spec, err := BuildSpec(name, edits)
		if invalid := parser.ValidateDeviceName(name); (err != nil) != (invalid != nil) {
			t.Fatalf("BuildSpec(%q) error %v; CDI says of the name: %v", name, err, invalid)
		}
		if err != nil {
			return
		}
		data, err := encodeSpec(spec)
		if err != nil {
			t.Fatalf("encode the spec of %q: %v", name, err)
		}
		file := SpecFileName(name)
		path := filepath.Join(dir, file)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Skipf("a file named after device %q: %v", name, err) // a name too long for the file system
		}
		defer func() { _ = os.Remove(path) }()
		read, err := cdi.ReadSpec(path, 0)
		if err != nil {
			t.Fatalf("BuildSpec(%q) built a spec the CDI library refuses: %v\n%s", name, err, data)
		}
		if len(read.Devices) != 1 || read.Devices[0].Name != name {
			t.Fatalf("BuildSpec(%q): the CDI library reads devices %+v", name, read.Devices)
		}
		if env := read.Devices[0].ContainerEdits.Env; utf8.ValidString(value) && !slices.Contains(env, "GPUSLICE_FUZZ="+value) {
			t.Fatalf("BuildSpec(%q) with GPUSLICE_FUZZ=%q: the CDI library reads env %q", name, value, env)
		}
		if names, err := SpecDevices(path); err != nil || !slices.Equal(names, []string{name}) {
			t.Fatalf("SpecDevices of the spec of %q = %q, %v", name, names, err)
		}
		if got, ok := DeviceOfFile(file); !ok || got != name {
			t.Fatalf("DeviceOfFile(%q) = %q, %t; want %q", file, got, ok, name)
		}
	})
}

package handoff

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"
)

// The CDI names of the plugin. Every container gets one device of kind
// CDIKind named after its device IDs and its holding of them (HolderName);
// its spec lives alone in CDISpecDir/gpuslice.io-vgpu_<name>.json.
const (
	cdiVendor = "gpuslice.io"
	cdiClass  = "vgpu"
	// CDIKind is the kind of every CDI spec the plugin writes.
	CDIKind = cdiVendor + "/" + cdiClass
	// NameHexLen is how many hex digits of the SHA-256 of the device IDs
	// name a CDI device (80 bits: collisions among a node's few hundred
	// device sets are out of reach).
	NameHexLen = 20
	cdiSpecExt = ".json"
)

// DeviceName returns the key of a container's device IDs: "v" and 20 hex
// digits of the SHA-256 of the sorted IDs joined by ",". It depends on the
// set only, never on order. It begins every CDI device name of a holder of
// the IDs (HolderName); releases before those named the device after the
// key alone.
func DeviceName(ids []string) string {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	sum := sha256.Sum256([]byte(strings.Join(sorted, ",")))
	return "v" + hex.EncodeToString(sum[:])[:NameHexLen]
}

// HolderName returns the CDI device name of one holding of the device IDs
// whose DeviceName is key: key, "-" and token, which Allocate chooses anew
// for each container it answers. IDs pass from container to container, and
// a runtime may resolve names from a cache of the spec folder that it
// refreshes when notified of a change (containerd's CRI plugin does), not
// when a container is created: a name kept from holder to holder could
// then resolve to the previous holder's edits, while a name of its own
// resolves to the holder's edits or to nothing (the start fails and is
// retried). token must be letters and digits.
func HolderName(key, token string) string {
	return key + "-" + token
}

// IsHolderName reports whether name is HolderName(key, token) for some
// token.
func IsHolderName(name, key string) bool {
	token, ok := strings.CutPrefix(name, key+"-")
	return ok && token != "" && parser.ValidateDeviceName(name) == nil && !strings.ContainsAny(token, "-_.:")
}

// CDIQualifiedName returns the fully qualified CDI device name
// ("gpuslice.io/vgpu=<name>") for a CDI device name.
func CDIQualifiedName(name string) string {
	return parser.QualifiedName(cdiVendor, cdiClass, name)
}

// SpecFileName is the base name of the spec file of device name.
func SpecFileName(name string) string {
	return cdi.GenerateTransientSpecName(cdiVendor, cdiClass, name) + cdiSpecExt
}

// DeviceOfFile returns the device name of a spec file the plugin wrote,
// or false for any other file.
func DeviceOfFile(base string) (string, bool) {
	prefix := cdi.GenerateTransientSpecName(cdiVendor, cdiClass, "")
	name, ok := strings.CutPrefix(base, prefix)
	if !ok {
		return "", false
	}
	name, ok = strings.CutSuffix(name, cdiSpecExt)
	if !ok || parser.ValidateDeviceName(name) != nil {
		return "", false
	}
	return name, true
}

// BuildSpec returns the spec of one device, name, carrying e. Its
// cdiVersion is the lowest the content needs, so older runtimes read it.
func BuildSpec(name string, e Edits) (*cdispecs.Spec, error) {
	if err := parser.ValidateDeviceName(name); err != nil {
		return nil, fmt.Errorf("CDI device name %q: %w", name, err)
	}
	var edits cdispecs.ContainerEdits
	for _, v := range e.Env {
		edits.Env = append(edits.Env, v.Name+"="+v.Value)
	}
	for _, d := range e.DeviceNodes {
		edits.DeviceNodes = append(edits.DeviceNodes, &cdispecs.DeviceNode{Path: d})
	}
	for _, m := range e.Mounts {
		access := "ro"
		if m.Writable {
			access = "rw"
		}
		edits.Mounts = append(edits.Mounts, &cdispecs.Mount{
			HostPath:      m.HostPath,
			ContainerPath: m.ContainerPath,
			Options:       []string{access, "nosuid", "nodev", "bind"},
		})
	}
	spec := &cdispecs.Spec{Kind: CDIKind, Devices: []cdispecs.Device{{Name: name, ContainerEdits: edits}}}
	version, err := cdispecs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec version: %w", err)
	}
	spec.Version = version
	return spec, nil
}

// WriteSpec atomically replaces the spec file of spec's only device in
// dir. The CDI library reads and validates the new file before it takes
// the old one's place, so a runtime never sees a spec it would reject.
func WriteSpec(dir string, spec *cdispecs.Spec) error {
	_, err := writeSpec(dir, "", spec, false)
	return err
}

// UpdateSpecFile is WriteSpec into dir/file (a name SpecFileName made,
// which may be another device's than spec's), except that a file that
// already holds exactly spec is left alone (false): every rewrite makes a
// container runtime that watches dir read all its specs again.
func UpdateSpecFile(dir, file string, spec *cdispecs.Spec) (bool, error) {
	return writeSpec(dir, file, spec, true)
}

// writeSpec does WriteSpec's work into dir/file ("": the file of spec's
// device); keep leaves a file that holds exactly spec alone, and the result
// says whether the file was written.
func writeSpec(dir, file string, spec *cdispecs.Spec, keep bool) (bool, error) {
	if len(spec.Devices) != 1 {
		return false, fmt.Errorf("CDI spec has %d devices, want 1", len(spec.Devices))
	}
	data, err := encodeSpec(spec)
	if err != nil {
		return false, fmt.Errorf("encode CDI spec: %w", err)
	}
	if file == "" {
		file = SpecFileName(spec.Devices[0].Name)
	}
	if keep {
		if old, err := os.ReadFile(filepath.Join(dir, file)); err == nil && bytes.Equal(old, data) { //nolint:gosec // G304: a spec file of the plugin's own folder.
			return false, nil
		}
	}
	//nolint:gosec // G306: container runtimes, not only root, may read CDI specs.
	err = WriteFileAtomic(dir, file, data, 0o644, func(tmp string) error {
		if _, err := cdi.ReadSpec(tmp, 0); err != nil {
			return fmt.Errorf("CDI spec for %s is invalid: %w", file, err)
		}
		return nil
	})
	return err == nil, err
}

// encodeSpec returns spec as JSON that the CDI library reads as it is. The
// library reads spec files as YAML, whose reader refuses characters JSON
// leaves as they are (DEL, the C1 controls, U+FFFE, U+FFFF) and reads U+0085
// (NEL) in a quoted string as a line break, folded to a space: those are
// written as \u escapes, which both read as the character.
func encodeSpec(spec *cdispecs.Spec) ([]byte, error) {
	data, err := json.Marshal(spec)
	if err != nil || !bytes.ContainsFunc(data, yamlUnsafe) {
		return data, err
	}
	// These characters occur only inside strings, and data is UTF-8 (json.Marshal's output).
	out := make([]byte, 0, len(data)+16)
	for _, r := range string(data) {
		if yamlUnsafe(r) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			out = utf8.AppendRune(out, r)
		}
	}
	return out, nil
}

// yamlUnsafe reports whether a YAML reader refuses r, or reads it as a line
// break, where JSON takes it as it is.
func yamlUnsafe(r rune) bool {
	return r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0xfffe || r == 0xffff
}

// SpecDevices returns the names of the devices the spec file at path
// defines: an error wrapping os.ErrNotExist when there is no such file, or
// another when it cannot be read or decoded.
func SpecDevices(path string) ([]string, error) {
	data, err := os.ReadFile(path) //nolint:gosec // G304: a spec file of a CDI spec folder.
	if err != nil {
		return nil, err
	}
	var spec cdispecs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", path, err)
	}
	names := make([]string, 0, len(spec.Devices))
	for _, d := range spec.Devices {
		names = append(names, d.Name)
	}
	return names, nil
}

// SpecDefines reports whether dir/file may define CDI device name: true
// unless the file is missing, or was read and defines another device.
func SpecDefines(dir, file, name string) bool {
	names, err := SpecDevices(filepath.Join(dir, file))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	return slices.Contains(names, name)
}

// SpecExists reports whether dir may have a file named after CDI device
// name (SpecFileName): true unless a look finds none.
func SpecExists(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, SpecFileName(name)))
	return !errors.Is(err, os.ErrNotExist)
}

// RemoveStaleSpecs deletes the plugin's spec files in dir whose device
// is not in live and that were written before cutoff (a spec written at
// Allocate or PreStartContainer must survive until the runtime has read
// it), and
// leftover temporary files. It returns the device names removed.
func RemoveStaleSpecs(dir string, live map[string]bool, cutoff time.Time) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name, ok := DeviceOfFile(e.Name())
		if !ok || live[name] {
			continue
		}
		info, err := e.Info()
		if err != nil || !info.ModTime().Before(cutoff) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	if err := RemoveStaleTemps(dir, cutoff); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

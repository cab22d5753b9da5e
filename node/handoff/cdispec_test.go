package handoff

import (
	"path/filepath"
	"slices"
	"testing"

	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// TestWriteSpecCharactersYAMLRefuses: a value holding characters that JSON leaves as they are
// but the CDI library's reader (YAML) refuses (DEL, a C1 control, U+FFFF) or reads as a line
// break (U+0085) is written so that the library reads the spec, and the value unchanged.
func TestWriteSpecCharactersYAMLRefuses(t *testing.T) {
	for _, value := range []string{"a\x7fb", "a\u0080b", "a\u0085b", "a\u009fb", "a\uffffb", "a\ufffeb", "a\ufeffb", "plain", "é\u2028<&>\x00\t"} {
		t.Run(value, func(t *testing.T) {
			dir := t.TempDir()
			spec, err := BuildSpec("dev", Edits{Env: []EnvVar{{Name: "V", Value: value}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := WriteSpec(dir, spec); err != nil {
				t.Fatalf("WriteSpec with V=%q: %v", value, err)
			}
			read, err := cdi.ReadSpec(filepath.Join(dir, SpecFileName("dev")), 0)
			if err != nil {
				t.Fatal(err)
			}
			if env := read.Devices[0].ContainerEdits.Env; !slices.Equal(env, []string{"V=" + value}) {
				t.Errorf("the CDI library reads env %q, want [%q]", env, "V="+value)
			}
		})
	}
}

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// templatePath is the manifest template, from test/cmd/krew-manifest.
var templatePath = filepath.Join("..", "..", "..", "hack", "krew", "gpuslice.yaml")

// platforms are the os/arch pairs make krew builds.
var platforms = []string{"darwin/amd64", "darwin/arm64", "linux/amd64", "linux/arm64"}

// archives writes one archive per platform, as make krew names them, into a folder and returns
// it with each archive's SHA-256 by file name.
func archives(t *testing.T, tag string) (string, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	sums := map[string]string{}
	for _, p := range platforms {
		name := fmt.Sprintf("kubectl-gpuslice_%s_%s.tar.gz", tag, strings.ReplaceAll(p, "/", "_"))
		content := []byte("archive of " + p)
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(content)
		sums[name] = hex.EncodeToString(sum[:])
	}
	return dir, sums
}

// TestManifest renders the shipped template for a tag and checks it against krew's rules and
// against what make krew builds: one platform per archive, each with its URL on the release,
// its SHA-256 and kubectl-gpuslice as the binary.
func TestManifest(t *testing.T) {
	t.Parallel()
	const tag = "v0.3.1"
	dir, sums := archives(t, tag)
	out := filepath.Join(t.TempDir(), "gpuslice.yaml")
	if err := write(templatePath, tag, dir, out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "gpuslice" || p.Spec.Version != tag || !strings.HasPrefix(p.Spec.Homepage, "https://") {
		t.Errorf("name %q, version %q, homepage %q; want gpuslice, %s, an https homepage", p.Name, p.Spec.Version, p.Spec.Homepage, tag)
	}
	var got []string
	for _, pl := range p.Spec.Platforms {
		name := filepath.Base(pl.URI)
		got = append(got, pl.Selector.MatchLabels["os"]+"/"+pl.Selector.MatchLabels["arch"])
		if want := "https://github.com/gpuslice/gpuslice/releases/download/" + tag + "/" + name; pl.URI != want {
			t.Errorf("uri %q, want %q", pl.URI, want)
		}
		if pl.Sha256 != sums[name] {
			t.Errorf("%s: sha256 %q, want %q", name, pl.Sha256, sums[name])
		}
		if pl.Bin != "kubectl-gpuslice" {
			t.Errorf("%s: bin %q, want kubectl-gpuslice", name, pl.Bin)
		}
		if want := fmt.Sprintf("kubectl-gpuslice_%s_%s_%s.tar.gz", tag, pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"]); name != want {
			t.Errorf("archive %q of selector %v, want %q", name, pl.Selector.MatchLabels, want)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, platforms) {
		t.Errorf("platforms %v, want %v", got, platforms)
	}
}

func TestRenderMissingArchive(t *testing.T) {
	t.Parallel()
	tmpl, err := os.ReadFile(templatePath)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Render(tmpl, "v0.1.0", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "kubectl-gpuslice_v0.1.0_linux_amd64.tar.gz") {
		t.Errorf("Render without archives: error = %v, want it to name the missing archive", err)
	}
}

// TestValidate checks that each of krew's rules catches its breakage.
func TestValidate(t *testing.T) {
	t.Parallel()
	good := func() Plugin {
		return Plugin{
			TypeMeta:   metav1.TypeMeta{APIVersion: krewAPIVersion, Kind: krewKind},
			ObjectMeta: metav1.ObjectMeta{Name: "gpuslice"},
			Spec: PluginSpec{Version: "v1.2.3", ShortDescription: "one line", Platforms: []Platform{{
				URI: "https://example.com/a.tar.gz", Sha256: strings.Repeat("a", 64), Bin: "kubectl-gpuslice",
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"os": "linux"}},
			}}},
		}
	}
	if err := Validate("gpuslice", good()); err != nil {
		t.Fatalf("Validate(good) = %v", err)
	}
	tests := map[string]struct {
		name    string
		breakIt func(p *Plugin)
		want    string
	}{
		"apiVersion":  {"gpuslice", func(p *Plugin) { p.APIVersion = "v1" }, `apiVersion="v1"`},
		"kind":        {"gpuslice", func(p *Plugin) { p.Kind = "Pod" }, `kind="Pod"`},
		"name":        {"other", func(*Plugin) {}, `metadata.name="gpuslice": must be the file's name "other"`},
		"unsafe name": {"a/b", func(p *Plugin) { p.Name = "a/b" }, `plugin name "a/b"`},
		"no summary":  {"gpuslice", func(p *Plugin) { p.Spec.ShortDescription = "" }, "spec.shortDescription: must be set"},
		"two lines":   {"gpuslice", func(p *Plugin) { p.Spec.ShortDescription = "a\nb" }, "must be one line"},
		"version":     {"gpuslice", func(p *Plugin) { p.Spec.Version = "1.2.3" }, `spec.version="1.2.3"`},
		"platforms":   {"gpuslice", func(p *Plugin) { p.Spec.Platforms = nil }, "spec.platforms: must list"},
		"uri":         {"gpuslice", func(p *Plugin) { p.Spec.Platforms[0].URI = "" }, "spec.platforms[0].uri: must be set"},
		"sha256":      {"gpuslice", func(p *Plugin) { p.Spec.Platforms[0].Sha256 = "ABC" }, `spec.platforms[0].sha256="ABC"`},
		"bin":         {"gpuslice", func(p *Plugin) { p.Spec.Platforms[0].Bin = "" }, "spec.platforms[0].bin: must be set"},
		"files":       {"gpuslice", func(p *Plugin) { p.Spec.Platforms[0].Files = []FileOperation{{From: "x"}} }, "files[0]: from and to must be set"},
		"no selector": {"gpuslice", func(p *Plugin) { p.Spec.Platforms[0].Selector = nil }, "selector: must be set"},
		"selector key": {"gpuslice", func(p *Plugin) {
			p.Spec.Platforms[0].Selector.MatchLabels["gpu"] = "a100"
		}, `key "gpu": only os and arch`},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := good()
			tt.breakIt(&p)
			if err := Validate(tt.name, p); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestParseRejectsUnknownFields(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte("apiVersion: x\nkind: Plugin\nspec:\n  shortDescripton: typo\n"))
	if err == nil || !strings.Contains(err.Error(), "shortDescripton") {
		t.Errorf("Parse(typo) error = %v, want it to name the unknown field", err)
	}
}

package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// archive reads an image archive into its files by name.
func archive(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[hdr.Name] = data
	}
}

// blobOf returns the blob of desc in files.
func blobOf(t *testing.T, files map[string][]byte, desc ocispec.Descriptor) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+desc.Digest.Encoded()]
	if !ok {
		t.Fatalf("blob %s missing", desc.Digest)
	}
	return b
}

// layerEntries returns "type path[ -> link]" for every entry of a gzip layer blob.
func layerEntries(t *testing.T, blob []byte) []string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		e := string(hdr.Typeflag) + " " + hdr.Name
		if hdr.Linkname != "" {
			e += " -> " + hdr.Linkname
		}
		out = append(out, e)
	}
}

func TestWriteArchive(t *testing.T) {
	spec := Spec{
		Name: "example.com/team/app:v1",
		Layers: []Layer{
			{{Path: "/usr/bin/app", Data: []byte("binary"), Mode: 0o755}, {Path: "/bin/sh", Link: "busybox"}},
			{{Path: "/etc/app.conf", Data: []byte("x=1\n")}},
		},
		Config: ocispec.ImageConfig{Entrypoint: []string{"/usr/bin/app"}, User: "65532:65532"},
	}
	var first, second bytes.Buffer
	if err := WriteArchive(&first, spec); err != nil {
		t.Fatal(err)
	}
	if err := WriteArchive(&second, spec); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.Bytes(), second.Bytes()) {
		t.Error("the same spec gave two different archives")
	}
	files := archive(t, first.Bytes())
	if got := string(files[ocispec.ImageLayoutFile]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %s", got)
	}
	var index ocispec.Index
	if err := json.Unmarshal(files[ocispec.ImageIndexFile], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(index.Manifests))
	}
	md := index.Manifests[0]
	if diff := cmp.Diff(map[string]string{annotationImageName: spec.Name, ocispec.AnnotationRefName: "v1"}, md.Annotations); diff != "" {
		t.Errorf("index annotations (-want +got):\n%s", diff)
	}
	var manifest ocispec.Manifest
	if err := json.Unmarshal(blobOf(t, files, md), &manifest); err != nil {
		t.Fatal(err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(blobOf(t, files, manifest.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(spec.Config, cfg.Config); diff != "" {
		t.Errorf("image config (-want +got):\n%s", diff)
	}
	if len(manifest.Layers) != 2 || len(cfg.RootFS.DiffIDs) != 2 {
		t.Fatalf("%d layers, %d diff IDs; want 2 and 2", len(manifest.Layers), len(cfg.RootFS.DiffIDs))
	}
	want := [][]string{
		{"5 bin/", "2 bin/sh -> busybox", "5 usr/", "5 usr/bin/", "0 usr/bin/app"},
		{"5 etc/", "0 etc/app.conf"},
	}
	for i, l := range manifest.Layers {
		if diff := cmp.Diff(want[i], layerEntries(t, blobOf(t, files, l))); diff != "" {
			t.Errorf("layer %d entries (-want +got):\n%s", i, diff)
		}
	}
}

func TestWriteArchiveRejects(t *testing.T) {
	good := Layer{{Path: "/a", Data: []byte("a")}}
	for name, tt := range map[string]struct {
		spec Spec
		want string
	}{
		"no tag":           {Spec{Name: "example.com:5000/app", Layers: []Layer{good}}, "want a full reference with a tag"},
		"no layers":        {Spec{Name: "app:v1"}, "no layers"},
		"relative path":    {Spec{Name: "app:v1", Layers: []Layer{{{Path: "etc/x", Data: []byte{}}}}}, `path "etc/x"`},
		"unclean path":     {Spec{Name: "app:v1", Layers: []Layer{{{Path: "/etc/../x", Data: []byte{}}}}}, `path "/etc/../x"`},
		"two kinds":        {Spec{Name: "app:v1", Layers: []Layer{{{Path: "/x", Dir: true, Link: "y"}}}}, "not several"},
		"named twice":      {Spec{Name: "app:v1", Layers: []Layer{{{Path: "/x", Data: []byte{}}, {Path: "/x", Data: []byte{}}}}}, "named twice"},
		"file as parent":   {Spec{Name: "app:v1", Layers: []Layer{{{Path: "/x", Data: []byte{}}, {Path: "/x/y", Data: []byte{}}}}}, "not a folder"},
		"no images at all": {Spec{}, "image name"},
	} {
		t.Run(name, func(t *testing.T) {
			err := WriteArchive(io.Discard, tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("WriteArchive error = %v, want one containing %q", err, tt.want)
			}
		})
	}
	if err := WriteArchive(io.Discard); err == nil {
		t.Error("WriteArchive of no images: no error")
	}
}

func TestHostFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("data"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "d")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sub, 0o700); err != nil { // whatever the umask
		t.Fatal(err)
	}
	for name, tt := range map[string]struct {
		host string
		want File
	}{
		"file":   {file, File{Path: "/x", Mode: 0o640, Data: []byte("data")}},
		"link":   {filepath.Join(dir, "l"), File{Path: "/x", Mode: 0o777, Link: "f"}},
		"folder": {sub, File{Path: "/x", Mode: 0o700, Dir: true}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := HostFile(tt.host, "/x")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("HostFile (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := HostFile(filepath.Join(dir, "missing"), "/x"); err == nil || !strings.Contains(err.Error(), "/x") {
		t.Errorf("HostFile of a missing file: error %v, want one naming the image path", err)
	}
}

func TestRecipeNeedsBinaries(t *testing.T) {
	r := Recipe{BinDir: t.TempDir(), Name: "example.com/gpuslice:v1"}
	if _, err := r.Gpuslice(); err == nil || !strings.Contains(err.Error(), "build the binaries first") {
		t.Errorf("Gpuslice without binaries: error %v, want one saying to build them", err)
	}
	if _, err := (Recipe{PausePath: filepath.Join(t.TempDir(), "none")}).Pause(); err == nil {
		t.Error("Pause without its binary: no error")
	}
}

func TestPackages(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Skip("no dpkg-query: not a Debian machine")
	}
	if _, err := Packages("gpuslice-no-such-package"); err == nil || !strings.Contains(err.Error(), "apt-get install gpuslice-no-such-package") {
		t.Errorf("Packages of a package not installed: error %v, want one saying how to install it", err)
	}
	l, err := Packages("libc6")
	if err != nil {
		t.Skipf("libc6 not installed: %v", err)
	}
	var loader bool
	for _, f := range l {
		if isSkipped(f.Path) {
			t.Errorf("%s: documentation kept", f.Path)
		}
		loader = loader || strings.HasSuffix(f.Path, "/ld-linux-x86-64.so.2") || strings.HasSuffix(f.Path, "/ld-linux-aarch64.so.1")
	}
	if !loader {
		t.Error("libc6's files hold no dynamic loader")
	}
}

func TestWriteArchiveUncompressed(t *testing.T) {
	spec := Spec{Name: "example.com/big:v1", Uncompressed: true, Layers: []Layer{{{Path: "/usr/bin/big", Data: []byte("binary"), Mode: 0o755}}}}
	var buf bytes.Buffer
	if err := WriteArchive(&buf, spec); err != nil {
		t.Fatal(err)
	}
	files := archive(t, buf.Bytes())
	var index ocispec.Index
	if err := json.Unmarshal(files[ocispec.ImageIndexFile], &index); err != nil {
		t.Fatal(err)
	}
	var manifest ocispec.Manifest
	if err := json.Unmarshal(blobOf(t, files, index.Manifests[0]), &manifest); err != nil {
		t.Fatal(err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(blobOf(t, files, manifest.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	l := manifest.Layers[0]
	if l.MediaType != ocispec.MediaTypeImageLayer || l.Digest != cfg.RootFS.DiffIDs[0] {
		t.Errorf("layer %s %s with diff ID %s, want a plain tar whose digest is its diff ID", l.MediaType, l.Digest, cfg.RootFS.DiffIDs[0])
	}
	var got []string
	tr := tar.NewReader(bytes.NewReader(blobOf(t, files, l)))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, hdr.Name)
	}
	if diff := cmp.Diff([]string{"usr/", "usr/bin/", "usr/bin/big"}, got); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
}

func TestKubeScheduler(t *testing.T) {
	if _, err := Packages("libc6"); err != nil {
		t.Skipf("no libc6 package to build on: %v", err)
	}
	dir := t.TempDir()
	bin := func(name, version string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\necho '"+version+"'\n"), 0o755); err != nil { //nolint:gosec // G306: an executable of the test
			t.Fatal(err)
		}
		return p
	}
	spec, err := Recipe{KubeSchedulerPath: bin("kube-scheduler", "Kubernetes v1.37.2")}.KubeScheduler()
	if err != nil {
		t.Fatal(err)
	}
	if spec.Name != KubeSchedulerRepo+":v1.37.2" || !spec.Uncompressed {
		t.Errorf("image %s (uncompressed %t), want %s:v1.37.2, uncompressed", spec.Name, spec.Uncompressed, KubeSchedulerRepo)
	}
	if diff := cmp.Diff([]string{"/usr/local/bin/kube-scheduler"}, spec.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
	if last := spec.Layers[len(spec.Layers)-1]; len(last) != 1 || last[0].Path != "/usr/local/bin/kube-scheduler" || last[0].Mode != 0o755 {
		t.Errorf("last layer %+v, want the binary alone at /usr/local/bin/kube-scheduler", last)
	}
	if _, err := (Recipe{KubeSchedulerPath: bin("other", "something else")}).KubeScheduler(); err == nil || !strings.Contains(err.Error(), "Kubernetes v<version>") {
		t.Errorf("a binary that prints no Kubernetes version: error %v, want one saying what was expected", err)
	}
}

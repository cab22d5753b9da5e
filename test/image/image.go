package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	_ "crypto/sha256" // go-digest's sha256 digester
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// annotationImageName is the index annotation containerd's importer (ctr images import, the client's
// Import) takes an image's full name from.
const annotationImageName = "io.containerd.image.name"

// epoch is the modification time of every file and the creation time of every image, so that the
// same inputs give the same digests.
var epoch = time.Unix(0, 0).UTC()

// File is one entry of a Layer: a regular file (Data), a folder (Dir) or a symbolic link (Link).
type File struct {
	// Path is the absolute path in the image, e.g. "/usr/bin/gpuslice".
	Path string
	// Mode is the permission bits; zero means 0o755 for folders and 0o644 for files.
	Mode os.FileMode
	// Data is a regular file's content.
	Data []byte
	// Dir makes the entry a folder; Link, when set, a symbolic link to Link.
	Dir  bool
	Link string
}

// Layer is one filesystem layer: its entries, written in path order whatever the order here.
// Parent folders that no entry names are added (0o755).
type Layer []File

// Spec is one image.
type Spec struct {
	// Name is the full reference the image is imported as, e.g. "ghcr.io/gpuslice/gpuslice:v0.1.0".
	Name string
	// Layers are applied in order, each over the ones before.
	Layers []Layer
	// Uncompressed stores the layers as plain tar instead of gzip: for images of large binaries
	// that never leave this machine, where compressing costs seconds and saves nothing.
	Uncompressed bool
	// Config is the image's run configuration (entrypoint, user, environment, labels).
	Config ocispec.ImageConfig
}

// Validate reports a Spec that cannot be built: no name or tag, no layers, or an entry whose
// path is not absolute and clean, or that is more than one kind.
func (s Spec) Validate() error {
	i := strings.LastIndex(s.Name, ":")
	if s.Name == "" || i < 0 || strings.Contains(s.Name[i:], "/") {
		return fmt.Errorf("image name %q: want a full reference with a tag, e.g. example.com/repo:tag", s.Name)
	}
	if len(s.Layers) == 0 {
		return fmt.Errorf("image %s: no layers", s.Name)
	}
	for li, l := range s.Layers {
		for _, f := range l {
			if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
				return fmt.Errorf("image %s layer %d: path %q: want an absolute, clean path below /", s.Name, li, f.Path)
			}
			if f.Dir && (f.Link != "" || f.Data != nil) || f.Link != "" && f.Data != nil {
				return fmt.Errorf("image %s layer %d: %s: a folder, a link or a file, not several", s.Name, li, f.Path)
			}
		}
	}
	return nil
}

// blob is content of the archive with its descriptor.
type blob struct {
	desc ocispec.Descriptor
	data []byte
}

// newBlob returns data as a blob of mediaType.
func newBlob(mediaType string, data []byte) blob {
	return blob{desc: ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}, data: data}
}

// jsonBlob returns v, encoded as JSON, as a blob of mediaType.
func jsonBlob(mediaType string, v any) (blob, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return blob{}, fmt.Errorf("encode %s: %w", mediaType, err)
	}
	return newBlob(mediaType, b), nil
}

// WriteArchive writes specs as one OCI image layout in a tar stream (what `ctr images import`
// and containerd's client Import read), for this machine's architecture on linux. Each image's
// index entry carries its full name. The same specs always give the same bytes.
func WriteArchive(w io.Writer, images ...Spec) error {
	if len(images) == 0 {
		return errors.New("write image archive: no images")
	}
	blobs := map[digest.Digest]blob{}
	var index ocispec.Index
	index.SchemaVersion = 2
	index.MediaType = ocispec.MediaTypeImageIndex
	for _, s := range images {
		if err := s.Validate(); err != nil {
			return err
		}
		manifest, err := buildImage(s, blobs)
		if err != nil {
			return err
		}
		desc := manifest.desc
		desc.Platform = &ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
		desc.Annotations = map[string]string{
			annotationImageName:       s.Name,
			ocispec.AnnotationRefName: s.Name[strings.LastIndex(s.Name, ":")+1:],
		}
		index.Manifests = append(index.Manifests, desc)
	}
	indexBlob, err := jsonBlob(ocispec.MediaTypeImageIndex, index)
	if err != nil {
		return err
	}
	layout, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	write := func(name string, data []byte) error {
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := write(ocispec.ImageLayoutFile, layout); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	if err := write(ocispec.ImageIndexFile, indexBlob.data); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, string(d))
	}
	sort.Strings(digests)
	for _, d := range digests {
		b := blobs[digest.Digest(d)]
		if err := write("blobs/"+b.desc.Digest.Algorithm().String()+"/"+b.desc.Digest.Encoded(), b.data); err != nil {
			return fmt.Errorf("write image archive: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	return nil
}

// buildImage adds the layers, config and manifest of s to blobs and returns the manifest.
func buildImage(s Spec, blobs map[digest.Digest]blob) (blob, error) {
	cfg := ocispec.Image{
		Created:  &epoch,
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		Config:   s.Config,
		RootFS:   ocispec.RootFS{Type: "layers"},
	}
	manifest := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest}
	for i, l := range s.Layers {
		raw, err := layerTar(l)
		if err != nil {
			return blob{}, fmt.Errorf("image %s layer %d: %w", s.Name, i, err)
		}
		b := newBlob(ocispec.MediaTypeImageLayer, raw)
		if !s.Uncompressed {
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz) // no name or time in the header: the same layer, the same bytes
			if _, err := zw.Write(raw); err != nil {
				return blob{}, err
			}
			if err := zw.Close(); err != nil {
				return blob{}, err
			}
			b = newBlob(ocispec.MediaTypeImageLayerGzip, gz.Bytes())
		}
		blobs[b.desc.Digest] = b
		manifest.Layers = append(manifest.Layers, b.desc)
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, digest.FromBytes(raw))
		cfg.History = append(cfg.History, ocispec.History{Created: &epoch, CreatedBy: fmt.Sprintf("gpuslice image: layer %d of %s", i, s.Name)})
	}
	cfgBlob, err := jsonBlob(ocispec.MediaTypeImageConfig, cfg)
	if err != nil {
		return blob{}, err
	}
	blobs[cfgBlob.desc.Digest] = cfgBlob
	manifest.Config = cfgBlob.desc
	m, err := jsonBlob(ocispec.MediaTypeImageManifest, manifest)
	if err != nil {
		return blob{}, err
	}
	blobs[m.desc.Digest] = m
	return m, nil
}

// layerTar returns the uncompressed tar of l: every entry and the parent folders it needs, in path
// order, owned by root, dated epoch.
func layerTar(l Layer) ([]byte, error) {
	entries := map[string]File{}
	for _, f := range l {
		if old, ok := entries[f.Path]; ok && (!old.Dir || !f.Dir) {
			return nil, fmt.Errorf("%s: named twice", f.Path)
		}
		entries[f.Path] = f
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			if old, ok := entries[d]; ok && !old.Dir {
				return nil, fmt.Errorf("%s: a parent of %s, but not a folder", d, f.Path)
			}
			if _, ok := entries[d]; !ok {
				entries[d] = File{Path: d, Dir: true}
			}
		}
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := entries[p]
		hdr := &tar.Header{Name: strings.TrimPrefix(p, "/"), ModTime: epoch, Format: tar.FormatPAX, Mode: int64(f.Mode.Perm())}
		switch {
		case f.Dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			if hdr.Mode == 0 {
				hdr.Mode = 0o755
			}
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.Link, 0o777
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Data))
			if hdr.Mode == 0 {
				hdr.Mode = 0o644
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

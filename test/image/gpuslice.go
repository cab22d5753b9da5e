package image

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Names of the images the local cluster's real runtime needs beside gpuslice's: the sandbox
// (pause) image, a small image with a shell for test pods, and the repository of the stock
// kube-scheduler the chart's scheduler pod runs (tagged with the binary's own version). All exist
// only on the machine that builds them: nothing is pulled.
const (
	PauseName         = "localhost/gpuslice/pause:v1"
	ShellName         = "localhost/gpuslice/shell:v1"
	KubeSchedulerRepo = "localhost/gpuslice/kube-scheduler"
)

// Binaries are gpuslice's commands the gpuslice image holds in /usr/bin (cmd/ of the product
// module); the chart runs them from there.
var Binaries = []string{"gpuslice-device-plugin", "gpuslice-dra-plugin", "gpuslice-scheduler", "gpuslice-webhook", "gpuslice"}

// path is the PATH of every image.
const pathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Recipe is what the images are built from.
type Recipe struct {
	// BinDir holds Binaries, built for linux on this machine's architecture (the device plugin
	// with cgo: it loads the driver's libnvidia-ml.so at run time, so the image carries glibc).
	BinDir string
	// PausePath is the static sandbox binary (test/cmd/gpuslice-pause).
	PausePath string
	// Name is the gpuslice image's reference, e.g. "ghcr.io/gpuslice/gpuslice:v0.1.0"; Version
	// its org.opencontainers.image.version label.
	Name, Version string
	// KubeSchedulerPath is a kube-scheduler binary built on this machine (make cluster's); empty
	// means no kube-scheduler image.
	KubeSchedulerPath string
}

// base returns the first layer of the gpuslice and kube-scheduler images (the same files, so
// containerd unpacks it once): glibc from the distribution's libc6 package, a passwd and group
// file with root and nonroot (65532), a home for nonroot, and /tmp.
func base() (Layer, error) {
	l, err := Packages("libc6")
	if err != nil {
		return nil, err
	}
	return append(l,
		File{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		File{Path: "/etc/group", Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		File{Path: "/home/nonroot", Dir: true, Mode: 0o700},
		File{Path: "/tmp", Dir: true, Mode: 0o777},
	), nil
}

// Gpuslice returns the gpuslice image: glibc from the distribution's libc6 package, a passwd and
// group file with root and nonroot (65532), /tmp, and Binaries in /usr/bin. It runs as 65532 with
// /usr/bin/gpuslice as its entrypoint; the chart names each component's binary as its command.
// The driver's libnvidia-ml.so is never in the image: the NVIDIA container runtime injects it.
func (r Recipe) Gpuslice() (Spec, error) {
	base, err := base()
	if err != nil {
		return Spec{}, err
	}
	var bins Layer
	for _, b := range Binaries {
		f, err := HostFile(filepath.Join(r.BinDir, b), "/usr/bin/"+b)
		if err != nil {
			return Spec{}, fmt.Errorf("gpuslice image (build the binaries first): %w", err)
		}
		if f.Data == nil {
			return Spec{}, fmt.Errorf("gpuslice image: %s is not a regular file", filepath.Join(r.BinDir, b))
		}
		f.Mode = 0o755
		bins = append(bins, f)
	}
	return Spec{
		Name:   r.Name,
		Layers: []Layer{base, bins},
		Config: ocispec.ImageConfig{
			User:       "65532:65532",
			Entrypoint: []string{"/usr/bin/gpuslice"},
			Env:        []string{pathEnv},
			WorkingDir: "/",
			Labels: map[string]string{
				ocispec.AnnotationTitle:   "gpuslice",
				ocispec.AnnotationVersion: r.Version,
				ocispec.AnnotationSource:  "https://github.com/gpuslice/gpuslice",
			},
		},
	}, nil
}

// Pause returns the sandbox image: the static binary PausePath as /pause.
func (r Recipe) Pause() (Spec, error) {
	f, err := HostFile(r.PausePath, "/pause")
	if err != nil {
		return Spec{}, fmt.Errorf("pause image: %w", err)
	}
	f.Mode = 0o755
	return Spec{
		Name:   PauseName,
		Layers: []Layer{{f}},
		Config: ocispec.ImageConfig{User: "65535:65535", Entrypoint: []string{"/pause"}},
	}, nil
}

// Shell returns the test image: busybox from the distribution's busybox-static package, with a
// link in /bin for each of its applets (sh, env, cat, sleep, ...).
func (r Recipe) Shell() (Spec, error) {
	l, err := Packages("busybox-static")
	if err != nil {
		return Spec{}, err
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return Spec{}, fmt.Errorf("shell image: list busybox applets: %w", err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			l = append(l, File{Path: "/bin/" + a, Link: "busybox"})
		}
	}
	return Spec{
		Name:   ShellName,
		Layers: []Layer{l},
		Config: ocispec.ImageConfig{Env: []string{pathEnv}, Cmd: []string{"/bin/sh"}},
	}, nil
}

// KubeScheduler returns the image of the stock kube-scheduler at KubeSchedulerPath, named
// KubeSchedulerRepo with the binary's version as its tag (what `kube-scheduler --version` prints,
// e.g. v1.37.2: the tag the chart picks by default on a cluster of that version). It holds the
// layer of base (the binary needs glibc) and the binary as /usr/local/bin/kube-scheduler, its
// entrypoint, as the upstream image has it. The layers are not compressed: the image never
// leaves this machine, and compressing over 100 MB would cost seconds at every build.
func (r Recipe) KubeScheduler() (Spec, error) {
	out, err := exec.Command(r.KubeSchedulerPath, "--version").Output() //nolint:gosec // G204: the recipe's own binary
	if err != nil {
		return Spec{}, fmt.Errorf("kube-scheduler image: %s --version: %w", r.KubeSchedulerPath, err)
	}
	// "Kubernetes v1.37.2"
	fields := strings.Fields(string(out))
	if len(fields) != 2 || fields[0] != "Kubernetes" || !strings.HasPrefix(fields[1], "v") {
		return Spec{}, fmt.Errorf("kube-scheduler image: %s --version printed %q, want \"Kubernetes v<version>\"", r.KubeSchedulerPath, out)
	}
	base, err := base()
	if err != nil {
		return Spec{}, err
	}
	f, err := HostFile(r.KubeSchedulerPath, "/usr/local/bin/kube-scheduler")
	if err != nil {
		return Spec{}, fmt.Errorf("kube-scheduler image: %w", err)
	}
	f.Mode = 0o755
	return Spec{
		Name:         KubeSchedulerRepo + ":" + fields[1],
		Layers:       []Layer{base, {f}},
		Uncompressed: true,
		Config: ocispec.ImageConfig{
			Entrypoint: []string{"/usr/local/bin/kube-scheduler"},
			Env:        []string{pathEnv},
			WorkingDir: "/",
			Labels:     map[string]string{ocispec.AnnotationTitle: "kube-scheduler", ocispec.AnnotationVersion: fields[1]},
		},
	}, nil
}

// Archives are the files WriteAll wrote.
type Archives struct {
	// Gpuslice holds the gpuslice image; Test the pause and shell images; KubeScheduler the
	// kube-scheduler image (empty when Recipe.KubeSchedulerPath is).
	Gpuslice, Test, KubeScheduler string
}

// WriteAll writes the gpuslice image to dir/gpuslice.tar, the pause and shell images to
// dir/test-images.tar and, with KubeSchedulerPath, the kube-scheduler image to
// dir/kube-scheduler.tar, each an OCI image layout in a tar (ctr images import reads them).
func (r Recipe) WriteAll(dir string) (Archives, error) {
	g, err := r.Gpuslice()
	if err != nil {
		return Archives{}, err
	}
	p, err := r.Pause()
	if err != nil {
		return Archives{}, err
	}
	s, err := r.Shell()
	if err != nil {
		return Archives{}, err
	}
	a := Archives{Gpuslice: filepath.Join(dir, "gpuslice.tar"), Test: filepath.Join(dir, "test-images.tar")}
	if err := writeFile(a.Gpuslice, g); err != nil {
		return Archives{}, err
	}
	if err := writeFile(a.Test, p, s); err != nil {
		return Archives{}, err
	}
	if r.KubeSchedulerPath == "" {
		return a, nil
	}
	k, err := r.KubeScheduler()
	if err != nil {
		return Archives{}, err
	}
	a.KubeScheduler = filepath.Join(dir, "kube-scheduler.tar")
	if err := writeFile(a.KubeScheduler, k); err != nil {
		return Archives{}, err
	}
	return a, nil
}

// writeFile writes the archive of specs to path.
func writeFile(path string, specs ...Spec) error {
	var buf bytes.Buffer
	if err := WriteArchive(&buf, specs...); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

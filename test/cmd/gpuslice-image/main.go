// Command gpuslice-image builds the gpuslice image, and the pause and shell images of the local
// cluster's real runtime (with --kube-scheduler, also its kube-scheduler image), without a
// container engine (make image): see package image.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpuslice/gpuslice/test/image"
)

func main() {
	var r image.Recipe
	var out string
	flag.StringVar(&r.BinDir, "bin-dir", "", "folder holding gpuslice's built binaries (required)")
	flag.StringVar(&r.PausePath, "pause", "", "the static gpuslice-pause binary (required)")
	flag.StringVar(&r.Name, "name", "", "the gpuslice image's reference, e.g. ghcr.io/gpuslice/gpuslice:v0.1.0 (required)")
	flag.StringVar(&r.Version, "version", "dev", "the image's version label")
	flag.StringVar(&out, "out", "", "folder the archives are written to (required)")
	flag.StringVar(&r.KubeSchedulerPath, "kube-scheduler", "", "a kube-scheduler binary to build the local cluster's kube-scheduler image from (make cluster's); empty: none")
	flag.Parse()
	if r.BinDir == "" || r.PausePath == "" || r.Name == "" || out == "" {
		fmt.Fprintln(os.Stderr, "gpuslice-image: --bin-dir, --pause, --name and --out are required")
		os.Exit(2)
	}
	a, err := r.WriteAll(out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuslice-image:", err)
		os.Exit(1)
	}
	fmt.Printf("gpuslice image %s: %s\npause and shell images %s, %s: %s\n", r.Name, a.Gpuslice, image.PauseName, image.ShellName, a.Test)
	if a.KubeScheduler != "" {
		fmt.Printf("kube-scheduler image %s, tagged with its version: %s\n", image.KubeSchedulerRepo, a.KubeScheduler)
	}
}

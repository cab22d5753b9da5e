// Package gpucheck holds the GPU check (make gpu-check, hack/gpu-check.sh):
// built with -tags nvml, it runs gpuslice's device plugin on the machine's
// real NVIDIA driver against the kubelet's real device manager from
// k8s.io/kubernetes, in-process, and writes a short report. Without the tag
// the package holds no test, so make test never touches a GPU.
package gpucheck

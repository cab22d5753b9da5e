// Package image builds container images without a container engine and without pulling: OCI image
// layouts, in a tar that containerd imports (ctr images import), assembled from files of this
// machine (gpuslice's built binaries and installed Debian packages). The same inputs give the same
// digests. It is the only recipe of the gpuslice image (make image) and of the pause and shell
// images the local cluster's real runtime runs.
package image

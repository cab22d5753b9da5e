#!/usr/bin/env bash
# gpu-check.sh checks gpuslice on a machine with NVIDIA GPUs (make gpu-check):
#   1. builds the product module with -tags nvml (go vet of the nvml-tagged code too);
#   2. runs the NVML tests against the real GPU(s) (node/nvidia, -tags nvml);
#   3. starts the device plugin on real NVML against the kubelet's real device manager,
#      in-process (test/gpucheck), and prints a report: GPUs (UUID, model, memory), driver
#      version, the XID event stream of each GPU, registration with the kubelet, and the
#      enforcement mechanisms the node qualifies for.
# It needs Go and the NVIDIA driver, nothing else (no cluster, no root). On a bare machine the
# first run downloads and builds the Go modules: allow 5 minutes. Without a driver it stops at
# once and says so.
#
# Usage: hack/gpu-check.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "${root}"
export CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations
tags=nvml,grpcnotrace

log() { printf 'gpu-check: %s\n' "$*"; }
fail() { printf 'gpu-check: %s\n' "$*" >&2; exit 2; }

# has_driver reports whether the NVIDIA kernel module is loaded or NVML is installed.
has_driver() {
  [[ -e /proc/driver/nvidia/version ]] && return 0
  command -v ldconfig >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1' && return 0
  return 1
}

has_driver || fail "no NVIDIA driver on this machine (no /proc/driver/nvidia/version and no libnvidia-ml.so.1 in the loader cache): run it on a machine with an NVIDIA GPU and its driver installed"
command -v go >/dev/null 2>&1 || fail "go is not on PATH: install a Go toolchain (the version of go.mod)"
if [[ -r /proc/driver/nvidia/version ]]; then
  log "kernel module: $(head -n 1 /proc/driver/nvidia/version)"
fi

start=$(date +%s)
log "build and vet with -tags ${tags}"
go build -tags "${tags}" ./...
go vet -tags "${tags}" ./deviceplugin/... ./cmd/gpuslice-device-plugin/
(cd test && go vet -tags "${tags}" ./gpucheck/)

log "NVML tests on the real GPUs"
go test -tags "${tags}" -count=1 -timeout 2m -run 'RealNVML' ./node/nvidia/

log "device plugin on real NVML against the kubelet device manager"
report=$(mktemp)
trap 'rm -f "${report}"' EXIT
status=0
(cd test && GPU_CHECK_REPORT="${report}" go test -tags "${tags}" -count=1 -timeout 4m -run '^TestGPUCheck$' ./gpucheck/) || status=$?

echo
echo "gpuslice GPU check report ($(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ), $(( $(date +%s) - start ))s)"
if [[ -s "${report}" ]]; then
  sed 's/^/  /' "${report}"
else
  echo "  (no report: the check failed before it started; see above)"
fi
if (( status != 0 )); then
  log "FAILED (exit ${status})"
  exit "${status}"
fi
log "passed"

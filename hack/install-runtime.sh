#!/usr/bin/env bash
# install-runtime.sh installs what the local cluster's real-runtime mode runs containers with:
#   runc, busybox-static                      Debian packages (apt-get), unless already installed
#   containerd, containerd-shim-runc-v2, ctr  github.com/containerd/containerd/v2 (CONTAINERD_VERSION)
#   loopback                                  github.com/containernetworking/plugins (CNI_VERSION): containerd
#                                             brings up each pod's lo with it; pod addresses come from
#                                             test/cmd/gpuslice-cni (hack/build-cluster.sh), which creates
#                                             no interface, so nothing is added to the host's network
# into _output/runtime/bin and _output/runtime/cni (ignored). Each Go binary is built with go install
# outside any module, so that it brings its own dependency versions and never touches gpuslice's
# go.mod files; a stamp file with the versions skips the build next time (seconds).
# It never clears the Go build cache.
#
# Usage: hack/install-runtime.sh [--force]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="${root}/_output/runtime"
CONTAINERD_VERSION=v2.4.2
CNI_VERSION=v1.10.0
force=false
[[ "${1:-}" == "--force" ]] && force=true

log() { printf 'install-runtime: %s\n' "$*"; }

# 1. runc and busybox from the distribution.
need=()
command -v runc >/dev/null 2>&1 || need+=(runc)
# The shell image takes busybox from this package's files: the dynamic busybox package would need a libc.
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' || need+=(busybox-static)
if ((${#need[@]} > 0)); then
	if ! command -v apt-get >/dev/null 2>&1; then
		log "missing ${need[*]} and no apt-get: install them with the distribution's package manager" >&2
		exit 1
	fi
	log "apt-get install ${need[*]}..."
	apt-get install -y --no-install-recommends "${need[@]}" >/dev/null
fi
log "runc: $(runc --version | head -1)"

# go_install builds packages of module@version into dir, outside any module.
go_install() {
	local dir=$1 version=$2 tags=$3
	shift 3
	local tmp
	tmp=$(mktemp -d)
	(cd "${tmp}" && for p in "$@"; do
		GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOBIN="${dir}" go install -tags "${tags}" "${p}@${version}" || exit 1
	done)
	rmdir "${tmp}"
}

# 2. containerd, its runc shim and ctr. CGO_ENABLED=0 with the tags of containerd's static build
# leaves out the btrfs, devmapper and zfs snapshotters (overlayfs and native remain).
stamp="${out}/bin/.containerd.version"
if [[ "${force}" == false && -x "${out}/bin/containerd" && -x "${out}/bin/containerd-shim-runc-v2" && -x "${out}/bin/ctr" &&
	"$(cat "${stamp}" 2>/dev/null)" == "${CONTAINERD_VERSION}" ]]; then
	log "containerd ${CONTAINERD_VERSION}: up to date"
else
	log "building containerd, containerd-shim-runc-v2 and ctr ${CONTAINERD_VERSION} (the first build takes ~4 min on 2 cores)..."
	start=${SECONDS}
	mkdir -p "${out}/bin"
	m=github.com/containerd/containerd/v2
	go_install "${out}/bin" "${CONTAINERD_VERSION}" "no_btrfs no_devmapper no_zfs no_tracing urfave_cli_no_docs osusergo netgo" \
		"${m}/cmd/containerd" "${m}/cmd/ctr"
	go_install "${out}/bin" "${CONTAINERD_VERSION}" "no_grpc urfave_cli_no_docs osusergo netgo" "${m}/cmd/containerd-shim-runc-v2"
	echo "${CONTAINERD_VERSION}" >"${stamp}"
	log "built containerd in $((SECONDS - start))s"
fi

# 3. The CNI plugin containerd sets up each pod's loopback interface with.
stamp="${out}/cni/.cni.version"
if [[ "${force}" == false && -x "${out}/cni/loopback" &&
	"$(cat "${stamp}" 2>/dev/null)" == "${CNI_VERSION}" ]]; then
	log "CNI plugin loopback ${CNI_VERSION}: up to date"
else
	log "building the CNI plugin loopback ${CNI_VERSION}..."
	start=${SECONDS}
	mkdir -p "${out}/cni"
	m=github.com/containernetworking/plugins/plugins
	go_install "${out}/cni" "${CNI_VERSION}" "" "${m}/main/loopback"
	echo "${CNI_VERSION}" >"${stamp}"
	log "built the CNI plugin in $((SECONDS - start))s"
fi
log "done: ${out}"

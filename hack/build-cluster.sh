#!/usr/bin/env bash
# build-cluster.sh builds the local test cluster's binaries into _output/cluster/bin (ignored):
#   kube-apiserver, kube-scheduler,
#   kube-controller-manager,
#   kubelet, kubectl                          k8s.io/kubernetes (version of test/go.mod), stamped
#   etcd                                      test/cmd/etcd (go.etcd.io/etcd/server/v3 etcdmain)
#   gpuslice-fake-cri                         test/cmd/gpuslice-fake-cri (k8s.io/cri-client fake + recorder)
#   gpuslice-cni                              test/cmd/gpuslice-cni (pod addresses on a real runtime)
#   gpuslice-build                            test/cmd/gpuslice-build: builds the above with progress
#   helm                                      helm.sh/helm/v3 (HELM_VERSION), go install outside any module
#   gpuslice-device-plugin, gpuslice-dra-plugin, gpuslice-scheduler,
#   gpuslice-webhook                          ./cmd/... of the product module (always rebuilt; seconds)
#
# The test-module binaries are skipped when a stamp file holds the same hash of test/go.mod,
# test/go.sum, test/cmd/** (but gpuslice-build), test/fakecri/** and this script; helm is skipped when its stamp holds
# HELM_VERSION. The first build takes about 7-10 minutes on 2 cores; later ones take seconds.
# It never clears the Go build cache.
#
# Usage: hack/build-cluster.sh [--force]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="${root}/_output/cluster/bin"
mkdir -p "${bin}"

KUBE_VERSION=v1.37.2
HELM_VERSION=v3.22.0
force=false
[[ "${1:-}" == "--force" ]] && force=true

log() { printf 'build-cluster: %s\n' "$*"; }

# hash_inputs prints one hash of everything the test-module binaries are built from.
hash_inputs() {
	(
		cd "${root}"
		{
			echo "${KUBE_VERSION}"
			cat test/go.mod test/go.sum hack/build-cluster.sh
			# gpuslice-build only shows the build's progress: it changes no binary.
			find test/cmd test/fakecri -type f -name '*.go' -not -path 'test/cmd/gpuslice-build/*' | LC_ALL=C sort | xargs cat
		} | sha256sum | cut -d' ' -f1
	)
}

total_start=${SECONDS}

# 1. Kubernetes, etcd and the fake CRI from the test module.
stamp="${bin}/.test-module.sha256"
want=$(hash_inputs)
k8s_bins=(kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl etcd gpuslice-fake-cri gpuslice-cni)
missing=false
for b in "${k8s_bins[@]}"; do [[ -x "${bin}/${b}" ]] || missing=true; done
if [[ "${force}" == false && "${missing}" == false && "$(cat "${stamp}" 2>/dev/null)" == "${want}" ]]; then
	log "${k8s_bins[*]}: up to date"
else
	log "building ${k8s_bins[*]} (Kubernetes ${KUBE_VERSION}; the first build takes ~7-10 min on 2 cores)..."
	start=${SECONDS}
	ldflags="-X k8s.io/component-base/version.gitVersion=${KUBE_VERSION}"
	ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
	ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "${KUBE_VERSION}" | cut -d. -f2)"
	(
		cd "${root}/test"
		# gpuslice-build runs go build for one binary after another and shows which one builds,
		# its packages compiled of those left, the time elapsed and an estimate of what is left:
		# one updating line on a terminal, a plain line every 10 s otherwise.
		go build -o "${bin}/" ./cmd/gpuslice-build
		"${bin}/gpuslice-build" -o "${bin}" -ldflags "${ldflags}" \
			k8s.io/kubernetes/cmd/kube-apiserver \
			k8s.io/kubernetes/cmd/kubelet \
			k8s.io/kubernetes/cmd/kube-scheduler \
			k8s.io/kubernetes/cmd/kube-controller-manager \
			k8s.io/kubernetes/cmd/kubectl \
			./cmd/etcd \
			./cmd/gpuslice-fake-cri \
			./cmd/gpuslice-cni
	)
	echo "${want}" >"${stamp}"
	log "built ${k8s_bins[*]} in $((SECONDS - start))s"
fi

# 2. helm, outside any module so that it brings its own dependency versions.
helm_stamp="${bin}/.helm.version"
if [[ "${force}" == false && -x "${bin}/helm" && "$(cat "${helm_stamp}" 2>/dev/null)" == "${HELM_VERSION}" ]]; then
	log "helm ${HELM_VERSION}: up to date"
else
	log "building helm ${HELM_VERSION} (the first build takes ~1.5 min)..."
	start=${SECONDS}
	tmp=$(mktemp -d)
	(cd "${tmp}" && GOWORK=off GOFLAGS=-buildvcs=false GOBIN="${bin}" go install "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}")
	rmdir "${tmp}"
	echo "${HELM_VERSION}" >"${helm_stamp}"
	log "built helm in $((SECONDS - start))s"
fi

# 3. gpuslice's own binaries, from the working tree: always, since go build's cache makes it cheap.
start=${SECONDS}
(cd "${root}" && go build -tags grpcnotrace -o "${bin}/" ./cmd/gpuslice-device-plugin ./cmd/gpuslice-dra-plugin ./cmd/gpuslice-scheduler ./cmd/gpuslice-webhook)
log "built gpuslice-device-plugin, gpuslice-dra-plugin, gpuslice-scheduler and gpuslice-webhook in $((SECONDS - start))s"

log "done in $((SECONDS - total_start))s: ${bin}"

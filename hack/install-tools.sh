#!/usr/bin/env bash
# install-tools.sh installs the tools `make verify` and `make lint` need into
# _output/tools, pinned, and skips any that is already there at that version.
# It never clears the Go build cache.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="${root}/_output/tools"
mkdir -p "${tools}"

GOLANGCI_LINT_VERSION=v2.15.0

install() { # name module version
	local name=$1 module=$2 version=$3 stamp="${tools}/.${1}.version"
	if [[ -x "${tools}/${name}" && "$(cat "${stamp}" 2>/dev/null)" == "${version}" ]]; then
		return
	fi
	echo "installing ${name} ${version} (one-time build, a few minutes on 2 cores)..."
	local start=${SECONDS}
	GOBIN="${tools}" GOFLAGS= go install "${module}@${version}"
	echo "${version}" >"${stamp}"
	echo "installed ${name} ${version} in $((SECONDS - start))s"
}

install golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint "${GOLANGCI_LINT_VERSION}"

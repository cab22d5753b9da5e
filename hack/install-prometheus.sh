#!/usr/bin/env bash
# install-prometheus.sh installs Prometheus and promtool from the distribution's package into
# _output/prometheus (ignored), nothing into the system: the package and the packages of the
# JavaScript its classic web UI loads are fetched with apt-get download and unpacked with
# dpkg -x, so that
#   _output/prometheus/usr/bin/prometheus      the server (the local cluster's Prometheus, make demo)
#   _output/prometheus/usr/bin/promtool        check rules, test rules (the alert unit tests)
#   _output/prometheus/usr/share/prometheus/web its UI assets (--web.local-assets)
# A stamp file with the package's version skips the download next time.
#
# Usage: hack/install-prometheus.sh [--force]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="${root}/_output/prometheus"
# The package and the version the tests were written against (Debian bookworm's); another 2.x
# works, and is said.
PACKAGE=prometheus
WANT_VERSION=2.42
# What the classic UI's pages load (the package's dependencies but adduser and libc6): its
# static folder links to their files with relative links.
UI_PACKAGES=(fonts-glyphicons-halflings libjs-bootstrap4 libjs-eonasdan-bootstrap-datetimepicker libjs-jquery
	libjs-jquery-hotkeys libjs-moment libjs-moment-timezone libjs-mustache libjs-popper.js libjs-rickshaw libjs-d3)
force=false
[[ "${1:-}" == "--force" ]] && force=true

log() { printf 'install-prometheus: %s\n' "$*"; }

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
	log "no apt-get or dpkg: install Prometheus ${WANT_VERSION} (with promtool) another way and set GPUSLICE_PROMETHEUS_DIR to a folder with usr/bin/prometheus and usr/bin/promtool" >&2
	exit 1
fi
version=$(apt-cache policy "${PACKAGE}" 2>/dev/null | awk '/Candidate:/ {print $2}')
if [[ -z "${version}" || "${version}" == "(none)" ]]; then
	log "apt-cache knows no ${PACKAGE} package (run apt-get update?)" >&2
	exit 1
fi
stamp="${out}/.prometheus.version"
if [[ "${force}" == false && -x "${out}/usr/bin/prometheus" && -x "${out}/usr/bin/promtool" &&
	"$(cat "${stamp}" 2>/dev/null)" == "${version}" ]]; then
	log "${PACKAGE} ${version}: up to date"
	exit 0
fi
[[ "${version}" == "${WANT_VERSION}".* ]] || log "note: ${PACKAGE} ${version}, not the ${WANT_VERSION} the tests were written against"

log "downloading ${PACKAGE} ${version} and the UI's ${#UI_PACKAGES[@]} packages..."
start=${SECONDS}
tmp=$(mktemp -d)
trap 'rm -rf "${tmp}"' EXIT
# apt-get download writes into the working folder; as root it warns that it cannot drop to _apt there.
(cd "${tmp}" && apt-get -qq download "${PACKAGE}=${version}" "${UI_PACKAGES[@]}" 2>&1 | { grep -v '^W: Download is performed unsandboxed' || true; })
ls "${tmp}"/"${PACKAGE}"_*.deb >/dev/null
rm -rf "${out}"
mkdir -p "${out}"
for deb in "${tmp}"/*.deb; do
	dpkg -x "${deb}" "${out}"
done
"${out}/usr/bin/promtool" --version >/dev/null
echo "${version}" >"${stamp}"
log "installed ${PACKAGE} ${version} in $((SECONDS - start))s: $("${out}/usr/bin/prometheus" --version 2>&1 | head -1)"

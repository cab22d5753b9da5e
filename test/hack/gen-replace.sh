#!/usr/bin/env bash
# gen-replace.sh pins every k8s.io staging module in test/go.mod (replace and require) to the
# release that matches the k8s.io/kubernetes version test/go.mod requires.
#
# k8s.io/kubernetes replaces its 33 staging modules with folders of its own repository
# (./staging/src/k8s.io/X); a module that requires it must replace each of them with the published
# k8s.io/X v0.N.M instead. The list is read from k8s.io/kubernetes' own go.mod, never typed.
#
# Usage:
#   test/hack/gen-replace.sh           rewrite the k8s.io replaces (and staging requires) in test/go.mod
#   test/hack/gen-replace.sh --verify  exit 1, with a diff, if test/go.mod differs from what the
#                                      rewrite would produce
#
# Only test/go.mod (or, with --verify, a temporary copy of it) is written. Needs go on PATH; reads the
# k8s.io/kubernetes go.mod from the module cache, or the module proxy when it is not cached yet.
set -euo pipefail

mode=update
case "${1:-}" in
"") ;;
--verify) mode=verify ;;
*)
	echo "usage: $0 [--verify]" >&2
	exit 2
	;;
esac

module_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gomod="${module_dir}/go.mod"

# The k8s.io/kubernetes version comes from test/go.mod's require line; v1.N.M maps to staging v0.N.M.
kube_version="$(go mod edit -json "${gomod}" |
	sed -n '/"Path": "k8s.io\/kubernetes"/{n;s/.*"Version": "\(v[^"]*\)".*/\1/p}')"
kube_version="${kube_version%%$'\n'*}" # the require, not a replace
if [[ ! "${kube_version}" =~ ^v1\.[0-9]+\.[0-9]+$ ]]; then
	echo "gen-replace.sh: test/go.mod must require k8s.io/kubernetes v1.N.M, found '${kube_version}'" >&2
	exit 1
fi
staging_version="v0.${kube_version#v1.}"

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

# Outside any module, so that the query neither needs nor touches test/go.sum.
upstream_gomod="$(cd "${tmp}" && GOWORK=off GOFLAGS=-mod=mod go list -m -f '{{.GoMod}}' "k8s.io/kubernetes@${kube_version}")"

# Every "k8s.io/X => ./staging/src/k8s.io/X" line of the upstream replace block becomes
# "k8s.io/X => k8s.io/X v0.N.M" in one generated block at the end of test/go.mod.
mapfile -t staging < <(sed -n '/^replace (/,/^)/p' "${upstream_gomod}" |
	sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/src/\(k8s\.io/[^[:space:]]*\)[[:space:]]*$#\1 \2#p')
if [[ "${#staging[@]}" -eq 0 ]]; then
	echo "gen-replace.sh: no staging replaces found in ${upstream_gomod}" >&2
	exit 1
fi

# Drop every k8s.io replace first, wherever it stands, so that a module upstream stopped staging
# does not linger and a hand-edited line cannot hide.
drops=()
while read -r old; do
	drops+=("-dropreplace=${old}")
done < <(go mod edit -json "${gomod}" |
	sed -n '/"Replace": \[/,$p' |
	sed -n 's/^[[:space:]]*"Path": "\(k8s\.io\/[^"]*\)",\{0,1\}$/\1/p' | sort -u)

# A require of a staging module names the version k8s.io/kubernetes' go.mod gave it (v0.0.0); the
# replace decides what is built, but the require is rewritten to the same version so that go.mod
# reads true. Requires are only rewritten, never added: go mod tidy decides which exist.
declare -A is_staging=()
for line in "${staging[@]}"; do
	is_staging["${line%% *}"]=1
done
requires=()
while read -r path version; do
	if [[ -n "${is_staging[${path}]:-}" && "${version}" != "${staging_version}" ]]; then
		requires+=("-require=${path}@${staging_version}")
	fi
done < <(go mod edit -json "${gomod}" | awk '
	/^\t"Require": \[/ { inside = 1; next }
	inside && /^\t\]/ { inside = 0 }
	inside && /"Path":/ { gsub(/[",]/, "", $2); path = $2 }
	inside && /"Version":/ { gsub(/[",]/, "", $2); print path, $2 }')

target="${gomod}"
if [[ "${mode}" == verify ]]; then
	target="${tmp}/go.mod"
	cp "${gomod}" "${target}"
fi
if [[ "${#drops[@]}" -gt 0 || "${#requires[@]}" -gt 0 ]]; then
	go mod edit "${drops[@]}" "${requires[@]}" "${target}"
fi
go mod edit -fmt "${target}"
{
	printf '\n// Staging modules of k8s.io/kubernetes %s, written by hack/gen-replace.sh: do not edit.\n' "${kube_version}"
	printf 'replace (\n'
	for line in "${staging[@]}"; do
		read -r old new <<<"${line}"
		printf '\t%s => %s %s\n' "${old}" "${new}" "${staging_version}"
	done
	printf ')\n'
} >>"${target}"
go mod edit -fmt "${target}"

if [[ "${mode}" == verify ]]; then
	if ! diff -u "${gomod}" "${target}"; then
		echo "gen-replace.sh: test/go.mod k8s.io replaces drifted from k8s.io/kubernetes ${kube_version}; run test/hack/gen-replace.sh" >&2
		exit 1
	fi
	echo "test/go.mod replaces match k8s.io/kubernetes ${kube_version} (${#staging[@]} staging modules)"
else
	echo "wrote ${#staging[@]} staging replaces (${staging_version}) to test/go.mod"
fi

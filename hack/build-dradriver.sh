#!/usr/bin/env bash
# build-dradriver.sh builds the cluster suite's DRA driver (test/dradriver, a
# module of its own so that podres-proxy's go.mod does not gain
# k8s.io/dynamic-resource-allocation) into
# PODRES_CACHE/dradriver-HASH/dradriver, HASH being a hash of the module's
# files, and prints that path on stdout. A second run with the same source
# takes no time. The module's go.sum pins every dependency; nothing is
# resolved at build time.
#
# Usage: hack/build-dradriver.sh           (see hack/lib.sh for the env)
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

GO="$(go_bin)"
export GOWORK=off GOFLAGS="-buildvcs=false -mod=readonly"

main() {
	local src="${PODRES_REPO}/test/dradriver" hash dir
	hash="$(cat "${src}/go.mod" "${src}/go.sum" "${src}"/*.go | sha256sum | cut -c1-12)"
	dir="${PODRES_CACHE}/dradriver-${hash}"
	if [[ ! -x "${dir}/dradriver" ]]; then
		mkdir -p "${PODRES_CACHE}/logs" "${dir}"
		run_logged "vet the DRA test driver" "${PODRES_CACHE}/logs/dradriver-vet.log" \
			in_dir "${src}" "${GO}" vet .
		# The driver is a module of its own, outside hack/test.sh's
		# staticcheck ./...: the same pinned staticcheck (podres-proxy's
		# go.mod tool directive) checks it here.
		local staticcheck
		staticcheck="$(in_dir "${PODRES_REPO}" "${GO}" tool -n staticcheck)"
		run_logged "staticcheck the DRA test driver" "${PODRES_CACHE}/logs/dradriver-staticcheck.log" \
			in_dir "${src}" "${staticcheck}" .
		run_logged "build the DRA test driver" "${PODRES_CACHE}/logs/dradriver-build.log" \
			in_dir "${src}" env CGO_ENABLED=0 "${GO}" build -trimpath -o "${dir}/dradriver.tmp" .
		mv "${dir}/dradriver.tmp" "${dir}/dradriver"
	fi
	log "DRA test driver: ${dir}/dradriver"
	echo "${dir}/dradriver"
}

main "$@"

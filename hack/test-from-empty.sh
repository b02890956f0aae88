#!/usr/bin/env bash
# test-from-empty.sh runs the test command (hack/test.sh) as a new machine
# would: with the Go module cache, the Go build cache and the node artifact
# cache (containerd, kubelet, pause image) pointed at new empty directories,
# so nothing left on this machine by an earlier run can make it pass. It
# prints the wall time and removes the directories afterwards (keep them
# with PODRES_KEEP_EMPTY_CACHES=1).
#
# Usage: hack/test-from-empty.sh        (as root to include the e2e suite)
# Environment: as hack/test.sh; PODRES_EMPTY_CACHES_DIR sets the parent of the
# throw-away caches (default: a new directory under ${TMPDIR:-/tmp}).
set -euo pipefail
cd "$(dirname "$0")/.."

parent="${PODRES_EMPTY_CACHES_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/podres-empty.XXXXXX")}"
mkdir -p "${parent}/gomodcache" "${parent}/gocache" "${parent}/podres-cache"
for d in gomodcache gocache podres-cache; do
	if [[ -n "$(ls -A "${parent}/${d}")" ]]; then
		echo "${parent}/${d} is not empty: give PODRES_EMPTY_CACHES_DIR a new directory" >&2
		exit 1
	fi
done

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	if [[ "${PODRES_KEEP_EMPTY_CACHES:-}" == "1" ]]; then
		echo "caches kept in ${parent}"
		return
	fi
	# The module cache is read-only by design; go clean makes it removable.
	GOMODCACHE="${parent}/gomodcache" go clean -modcache >/dev/null 2>&1 || true
	rm -rf "${parent}"
}
trap cleanup EXIT

export GOMODCACHE="${parent}/gomodcache" GOCACHE="${parent}/gocache" PODRES_CACHE="${parent}/podres-cache"
echo "empty caches: GOMODCACHE=${GOMODCACHE} GOCACHE=${GOCACHE} PODRES_CACHE=${PODRES_CACHE}"
start=$(date +%s)
rc=0
hack/test.sh || rc=$?
elapsed=$(($(date +%s) - start))
printf 'hack/test.sh from empty caches: exit %d in %dm%02ds\n' "${rc}" $((elapsed / 60)) $((elapsed % 60))
exit "${rc}"

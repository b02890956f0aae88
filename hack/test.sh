#!/usr/bin/env bash
# The project's test command (the README's, and what CI runs):
#   formatting, vet, staticcheck and shellcheck, unit tests with the race detector, a short fuzzing
#   pass over every decoder, then the real-node end-to-end suite when run as
#   root (it builds and starts containerd and a kubelet; see hack/build-node.sh).
# Environment:
#   PODRES_FUZZTIME   time per fuzz target (default 10s; 0 skips fuzzing)
#   PODRES_HOG_TIME   bound of the unit tests run again beside a CPU hog (default 5m)
#   PODRES_E2E        1 forces the e2e suite, 0 skips it (default: run as root)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "gofmt"
unformatted=$(git ls-files -z '*.go' | xargs -0 gofmt -l)
if [[ -n "$unformatted" ]]; then
	printf 'gofmt would change:\n%s\n' "$unformatted" >&2
	exit 1
fi

step "go vet"
go vet ./...

# staticcheck, pinned by go.mod's tool directive (its sums in go.sum), so a
# new machine builds the same version from the module proxy: it finds what vet
# does not (an error shadowed and never checked, dead code).
step "staticcheck"
go tool staticcheck ./...

# Lint every script with shellcheck (Debian's package; .ci/run installs it).
step "shellcheck"
if ! command -v shellcheck >/dev/null; then
	echo "shellcheck is not installed (apt-get install shellcheck; .ci/run does this)" >&2
	exit 1
fi
git ls-files -z 'hack/*.sh' '.ci/run' | xargs -0 shellcheck

step "unit tests (race detector)"
go test -race -count=1 ./...

# The packages with concurrency and timeouts, three more times beside a CPU
# hog on every core: a test that depends on timing fails here, not on a
# contributor's busy machine. Bounded by PODRES_HOG_TIME (default 5m).
step "unit tests again beside a CPU hog"
hogs=()
for _ in $(seq "$(nproc)"); do
	(while :; do :; done) &
	hogs+=("$!")
done
trap 'kill "${hogs[@]}" 2>/dev/null || true' EXIT
timeout "${PODRES_HOG_TIME:-5m}" go test -race -count=3 ./plugin/... ./proxy/... ./state/...
kill "${hogs[@]}" 2>/dev/null || true
trap - EXIT

fuzztime=${PODRES_FUZZTIME:-10s}
if [[ "$fuzztime" != "0" ]]; then
	step "fuzzing each decoder for $fuzztime"
	# Every Fuzz* function in the module, one at a time as go test requires.
	git grep -o -E '^func Fuzz[A-Za-z0-9_]+' -- '*_test.go' | while IFS=: read -r file decl; do
		name=${decl#func }
		echo "fuzz ./$(dirname "$file") $name"
		go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "./$(dirname "$file")"
	done
fi

e2e=${PODRES_E2E:-}
if [[ "$e2e" == "1" && ! -d test/e2e ]]; then
	echo "PODRES_E2E=1 but there is no end-to-end suite in this tree (test/e2e)" >&2
	exit 1
fi
if [[ -z "$e2e" ]]; then
	if [[ $(id -u) -eq 0 && -d test/e2e ]]; then e2e=1; else e2e=0; fi
fi
if [[ "$e2e" == "1" ]]; then
	step "end-to-end on a real node (containerd + kubelet)"
	PODRES_E2E=1 go test -count=1 -timeout 60m -v ./test/e2e/...
else
	step "skipping the end-to-end suite (it needs root and test/e2e; PODRES_E2E=1 to force)"
fi

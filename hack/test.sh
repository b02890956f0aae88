#!/usr/bin/env bash
# The project's test command (the README's, and what CI runs):
#   formatting, vet, staticcheck and shellcheck, unit tests with the race detector, a short fuzzing
#   pass over every decoder, a smoke run of the List benchmark report, then, when run as root, the
#   real-node end-to-end suite twice, with the kubelet's PodsAPI gate on and off (it builds and
#   starts containerd and a kubelet; see hack/build-node.sh), and the one-node cluster suite
#   (test/cluster: etcd and the control plane too, built and cached by hack/build-cluster.sh; its
#   kubelet serves the Pods API, which serve watches as deploy/base installs it, and reads /pods
#   instead with --kubelet-pods-api-socket=, as the RBAC test and the Helm chart install it).
# Environment:
#   PODRES_FUZZTIME   inputs per fuzz target (default 20000x; a duration such as 10s also works; 0 skips)
#   PODRES_E2E        1 forces the e2e suites, 0 skips them (default: run as root)
#   PODRES_CLUSTER_E2E   0 skips the cluster suite (test/cluster) that runs after the node suite
#                     (default 1 whenever the e2e suites run); the first run on a machine builds
#                     etcd and the control plane into PODRES_CACHE (13-15 min on 2 cores), later
#                     runs reuse them
#   PODRES_LINT_ONLY  1 stops after the lint steps (gofmt, vet, staticcheck, shellcheck)
#   PODRES_STRESS_COUNT  runs of the timing-sensitive packages under a CPU hog (default 2; 0 skips)
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

if [[ "${PODRES_LINT_ONLY:-}" == "1" ]]; then
	step "lint only (PODRES_LINT_ONLY=1): done"
	exit 0
fi

step "unit tests (race detector)"
go test -race -count=1 ./...

# The packages whose tests wait on servers, deadlines and background writers
# run again while a busy loop occupies every core, so a test that only passes
# on an idle machine fails here, not on a contributor's laptop. Bounded: the
# hog ends with the step, and the step with its timeout.
stress=${PODRES_STRESS_COUNT:-2}
if [[ "$stress" != "0" ]]; then
	step "timing-sensitive packages ${stress}x more with a CPU hog on every core"
	hogs=()
	for _ in $(seq "$(nproc)"); do
		(while :; do :; done) &
		hogs+=($!)
	done
	trap 'kill "${hogs[@]}" 2>/dev/null || true' EXIT
	rc=0
	timeout 900 go test -race -count="$stress" ./proxy/... ./allocator/... ./trust/... ./inventory/... ./kubeletpods/... ./plugin/... ./state/... ./cmd/... || rc=$?
	kill "${hogs[@]}" 2>/dev/null || true
	wait "${hogs[@]}" 2>/dev/null || true
	trap - EXIT
	if ((rc != 0)); then
		echo "a test failed (or the step timed out) with the machine busy: it depends on timing" >&2
		exit "$rc"
	fi
fi

# A count, not a duration: with a duration, Go 1.26's fuzz coordinator can report its own
# -fuzztime deadline as a failure ("context deadline exceeded", no crasher written) when the
# deadline fires while a worker is busy (go.dev/issue/75804, fixed in Go 1.27). A count has no
# deadline to race, and gives every run the same amount of fuzzing however loaded the machine is.
# 20000 inputs take 1 to 12 s per target on a 2-core machine.
fuzztime=${PODRES_FUZZTIME:-20000x}
if [[ "$fuzztime" != "0" ]]; then
	step "fuzzing each decoder ($fuzztime)"
	# Every Fuzz* function in the module, one at a time as go test requires.
	git grep -o -E '^func Fuzz[A-Za-z0-9_]+' -- '*_test.go' | while IFS=: read -r file decl; do
		name=${decl#func }
		echo "fuzz ./$(dirname "$file") $name"
		go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "./$(dirname "$file")"
	done
fi

# The List benchmark report, once over 10 pods and one round: its figures mean nothing here,
# but it must still run (it starts each proxy it measures as a process of its own).
step "List benchmark report, smoke run (PODRES_BENCH=quick)"
PODRES_BENCH=quick go test -count=1 -run '^TestBenchmarkReport$' ./proxy

e2e=${PODRES_E2E:-}
if [[ "$e2e" == "1" && ! -d test/e2e ]]; then
	echo "PODRES_E2E=1 but there is no end-to-end suite in this tree (test/e2e)" >&2
	exit 1
fi
if [[ -z "$e2e" ]]; then
	if [[ $(id -u) -eq 0 && -d test/e2e ]]; then e2e=1; else e2e=0; fi
fi
if [[ "$e2e" == "1" ]]; then
	e2e_logs=$(mktemp -d)
	step "end-to-end on a real node (containerd + kubelet), the kubelet's PodsAPI gate on"
	PODRES_E2E=1 go test -count=1 -timeout 60m -v ./test/e2e/... | tee "$e2e_logs/gate-on"
	# The same suite with the gate off, so /pods is serve's pod source, as on every kubelet
	# before 1.36 and wherever the alpha gate stays off. Its builds are the first run's; the
	# store's pruning test is left out (80 s of waiting for the store's clock, which no pod
	# source changes). About 2 minutes 15 s more.
	step "end-to-end on a real node, the kubelet's PodsAPI gate off (serve reads /pods)"
	PODRES_E2E=1 PODRES_E2E_PODS_API=0 PODRES_E2E_SKIP_BUILD=1 go test -count=1 -timeout 30m -v \
		-skip '^TestRemovedPodIsPrunedFromAnswerAndStore$' ./test/e2e/... | tee "$e2e_logs/gate-off"
	step "serve's reads of every pod in the two node runs"
	grep -h '^e2e: pod source reads' "$e2e_logs/gate-on" "$e2e_logs/gate-off" || echo "(none: serve did not run)"
	rm -rf "$e2e_logs"
	if [[ "${PODRES_CLUSTER_E2E:-1}" != "0" && -d test/cluster ]]; then
		# A step of its own, so the build's time is not the suite's: cached by
		# version in PODRES_CACHE (seconds when warm), a progress line every
		# 30 s while it compiles.
		step "etcd, the control plane, kubectl and the DRA test driver for the cluster suite (hack/build-cluster.sh, cached)"
		hack/build-cluster.sh
		step "end-to-end on a one-node cluster (deploy/base and the Helm chart, as users install them)"
		cluster_log=$(mktemp)
		PODRES_E2E=1 go test -count=1 -timeout 40m -v ./test/cluster/... | tee "$cluster_log"
		step "serve's reads of every pod in the cluster run, by configuration (the Pods API, /pods)"
		grep -h '^cluster: pod source reads' "$cluster_log" || echo "(none: serve did not run)"
		rm -f "$cluster_log"
	else
		step "skipping the cluster suite (PODRES_CLUSTER_E2E=0)"
	fi
else
	step "skipping the end-to-end suite (it needs root and test/e2e; PODRES_E2E=1 to force)"
fi

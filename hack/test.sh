#!/usr/bin/env bash
# The project's test command (the README's, and what CI runs):
#   formatting, vet, staticcheck and shellcheck, unit tests with the race detector (from a copy of
#   the work tree with nothing beside it, as a user's clone has nothing beside it), promtool's
#   check and unit tests of the alert rules (deploy/components/monitoring), a short fuzzing
#   pass over every decoder, a smoke run of the List benchmark report, then, when run as root, the
#   real-node end-to-end suite twice, on kubelet 1.37 with its Pods API on by default and on kubelet
#   1.36 with the PodsAPI gate off (it builds and starts containerd and each kubelet; see
#   hack/build-node.sh), and the one-node cluster suite
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
#   PODRES_E2E_ONLY   1 skips everything before the end-to-end suites (to rerun them)
#   PODRES_E2E_MATRIX 1 adds the node suite on the oldest kubelet and containerd the README's
#                     compatibility table claims (MATRIX_OLDEST_* below; not in CI's default run)
#   PODRES_STRESS_COUNT  runs of the timing-sensitive packages under a CPU hog (default 2; 0 skips)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }

# The kubelet of the /pods run, and the matrix's oldest versions (PODRES_E2E_MATRIX=1).
PODS_KUBELET_VERSION=v1.36.3
MATRIX_OLDEST_KUBELET=v1.33.13
MATRIX_OLDEST_CONTAINERD=v1.7.35
# version_of prints a version hack/lib.sh defaults (KUBERNETES_VERSION, CONTAINERD_VERSION).
version_of() { (source hack/lib.sh && echo "${!1}"); }

# node_suite_failed LOG: after a node suite that failed, stops the node it
# left running. A test that panics ends the suite's process before its
# teardown, and the node's containerd shims would hold the suite's lock
# (/tmp/podres-e2e.lock) for the next run. The suite prints its node root
# first ("e2e: node root ROOT, logs in DIR"); node-down.sh is safe on a node
# already down. Returns 1, for the caller to fail.
node_suite_failed() {
	local root
	root=$(sed -n 's/^e2e: node root \(\/[^,]*\), logs in .*/\1/p' "$1" | tail -n 1)
	if [[ -n "$root" && -d "$root" && "${PODRES_E2E_KEEP_ROOT:-}" != "1" ]]; then
		echo "the node suite failed and left its node root $root: stopping that node (hack/node-down.sh)" >&2
		PODRES_NODE_PURGE=1 hack/node-down.sh "$root" >&2 || true
	fi
	return 1
}
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="$PATH:/usr/local/go/bin"
fi

# What the steps below run on, from Debian's packages: git and shellcheck for
# the lint steps; for the end-to-end suites (root only), runc and the CNI
# plugins, iptables/iproute2 for the bridge network, jq and curl for the node
# scripts, and openssl for the cluster suite's throw-away CA. As root (CI, a
# fresh box) the missing ones are installed; otherwise the command is shown.
# Go tools (staticcheck, deadcode, promtool) are pinned in go.mod and built by `go tool`.
packages=(git shellcheck)
if [[ $(id -u) -eq 0 ]]; then
	packages+=(ca-certificates runc containernetworking-plugins iptables iproute2 jq curl openssl)
fi
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		echo "missing Debian packages: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
		exit 1
	fi
	step "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# alone_copy copies the work tree (what git tracks, and the new files it does not ignore) into a
# folder with nothing beside it, as a fresh clone has nothing beside it, and prints the copy's path.
# The folder is the same for a work tree from one run to the next (under the user's cache, named by
# a hash of the tree's path), so that Go's build cache, which keys a package by its folder, still hits.
alone_copy() {
	local base dest
	base=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/podres-proxy/alone/$(pwd -P | sha256sum | cut -c1-16)
	dest=$base/podres-proxy
	rm -rf "$base"
	mkdir -p "$dest"
	git ls-files -z --cached --others --exclude-standard |
		while IFS= read -r -d '' f; do
			if [[ -e "$f" || -L "$f" ]]; then printf '%s\0' "$f"; fi
		done |
		tar --null -T - -cf - | tar -xf - -C "$dest"
	echo "$dest"
}

# checks runs everything before the end-to-end suites.
checks() {
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

	# deadcode, pinned as staticcheck is: the functions no test and no command
	# reaches, exported ones included, which staticcheck's unused check (U1000)
	# does not report. It exits 0 whatever it finds, so any output fails.
	step "deadcode"
	dead=$(go tool deadcode -test ./...)
	if [[ -n "$dead" ]]; then
		printf 'unreachable functions (delete them):\n%s\n' "$dead" >&2
		exit 1
	fi
	# And the product's own: a function in a package outside test/ that only
	# tests reach belongs in a _test.go file or under test/ (helpers only
	# tests use), not in the binary's packages.
	dead=$(go tool deadcode ./... | grep -v '^test/' || true)
	if [[ -n "$dead" ]]; then
		printf 'functions only tests reach (move them into a _test.go file or under test/):\n%s\n' "$dead" >&2
		exit 1
	fi

	# Lint every script with shellcheck (Debian's package, installed above).
	step "shellcheck"
	git ls-files -z 'hack/*.sh' '.ci/run' | xargs -0 shellcheck

	if [[ "${PODRES_LINT_ONLY:-}" == "1" ]]; then
		step "lint only (PODRES_LINT_ONLY=1): done"
		exit 0
	fi

	# Once, from a copy of the work tree with nothing beside it (alone_copy): the repository must
	# need nothing outside itself (no ../shared, no ignored build output), and a test that reads
	# such a file fails here as it would in a user's clone. The copy is the tree's code, so this is
	# the unit step, not a second one.
	step "unit tests (race detector), from a copy of the work tree with nothing beside it"
	alone=$(alone_copy)
	echo "in $alone"
	(cd "$alone" && go test -race -count=1 ./...)

	# The alerts of deploy/components/monitoring (the chart's are the same; deploy/'s tests check
	# it), with promtool pinned by go.mod's tool directive: its rule groups, taken out of the
	# PrometheusRule object into the plain rule file promtool reads, checked and unit-tested
	# (each alert fires on its input series and stays silent on a quiet node's).
	step "alert rules: promtool check rules, promtool test rules"
	rules=$(mktemp -d)
	go run ./hack/promrules deploy/components/monitoring/prometheusrule.yaml >"$rules/podres-proxy.rules.yaml"
	cp deploy/components/monitoring/prometheusrule.test.yaml "$rules/"
	go tool promtool check rules "$rules/podres-proxy.rules.yaml"
	go tool promtool test rules "$rules/prometheusrule.test.yaml"
	rm -rf "$rules"

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
		timeout 900 go test -race -count="$stress" ./proxy/... ./allocator/... ./trust/... ./inventory/... ./kubeletpods/... ./plugin/... ./state/... ./cmd/... ./report/... ./internal/... ./dra/... ./metrics/... || rc=$?
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

	# The List benchmark report, once over 10 pods and 20 calls per series: its figures mean nothing here,
	# but it must still run (it starts each proxy it measures as a process of its own), in its own
	# setup and in listbench's (docs/performance.md).
	step "List benchmark report, smoke run (PODRES_BENCH=quick)"
	PODRES_BENCH=quick go test -count=1 -run '^TestBenchmarkReport$' ./proxy
	PODRES_BENCH=quick PODRES_BENCH_SETUP=listbench go test -count=1 -run '^TestBenchmarkReport$' ./proxy
}

if [[ "${PODRES_E2E_ONLY:-}" == "1" ]]; then
	step "only the end-to-end suites (PODRES_E2E_ONLY=1)"
else
	checks
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
	e2e_logs=$(mktemp -d)
	step "end-to-end on a real node (containerd + kubelet $(version_of KUBERNETES_VERSION), its Pods API on by default)"
	PODRES_E2E=1 go test -count=1 -timeout 60m -v ./test/e2e/... | tee "$e2e_logs/default" ||
		node_suite_failed "$e2e_logs/default"
	# Kubelet 1.36 with the PodsAPI gate off, so /pods is serve's pod source, as on most
	# clusters today. It builds that kubelet (cached); the store's pruning test is left out
	# (80 s of waiting for the store's clock, which no pod source changes).
	step "end-to-end on a real node, kubelet ${PODS_KUBELET_VERSION} with the PodsAPI gate off (serve reads /pods)"
	KUBERNETES_VERSION="$PODS_KUBELET_VERSION" PODRES_E2E=1 PODRES_E2E_PODS_API=0 go test -count=1 -timeout 30m -v \
		-skip '^TestRemovedPodIsPrunedFromAnswerAndStore$' ./test/e2e/... | tee "$e2e_logs/pods" ||
		node_suite_failed "$e2e_logs/pods"
	if [[ "${PODRES_E2E_MATRIX:-0}" == "1" ]]; then
		# The oldest versions the README's compatibility table claims, each built and cached
		# like the others: not in CI's default run (two more builds and runs, ~15 minutes).
		step "matrix: the node suite on kubelet ${MATRIX_OLDEST_KUBELET} (no Pods API: serve reads /pods)"
		KUBERNETES_VERSION="$MATRIX_OLDEST_KUBELET" PODRES_E2E=1 PODRES_E2E_PODS_API=0 go test -count=1 -timeout 30m -v \
			-skip '^TestRemovedPodIsPrunedFromAnswerAndStore$' ./test/e2e/... | tee "$e2e_logs/matrix-kubelet" ||
			node_suite_failed "$e2e_logs/matrix-kubelet"
		step "matrix: the node suite on containerd ${MATRIX_OLDEST_CONTAINERD} (NRI enabled in its configuration)"
		CONTAINERD_VERSION="$MATRIX_OLDEST_CONTAINERD" PODRES_E2E=1 go test -count=1 -timeout 30m -v \
			-skip '^TestRemovedPodIsPrunedFromAnswerAndStore$' ./test/e2e/... | tee "$e2e_logs/matrix-containerd" ||
			node_suite_failed "$e2e_logs/matrix-containerd"
	fi
	step "the versions each node run ran on, and serve's reads of every pod in it"
	for run in default pods matrix-kubelet matrix-containerd; do
		[[ -f "$e2e_logs/$run" ]] || continue
		grep -h -e '^e2e: kubelet' -e '^e2e: pod source reads' -e '^\(ok\|FAIL\)[[:space:]]' "$e2e_logs/$run" || echo "(none: serve did not run)"
	done
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

#!/usr/bin/env bash
# local-up.sh brings up a real node on this machine with podres-proxy in
# front of its kubelet, runs a few demo pods carrying Koordinator
# annotations (hack/demo/*.yaml), and prints what the proxy answers and what
# its state store recorded:
#
#   1. builds or reuses containerd, the kubelet and the pause image
#      (hack/build-node.sh; the first run takes about 10 minutes on 2 cores);
#   2. starts containerd (with NRI and CNI) and a standalone kubelet under
#      PODRES_LOCAL_ROOT (hack/node-up.sh);
#   3. builds podres-proxy and starts `podres-proxy serve` against them;
#   4. drops the demo pods into the kubelet's static pod directory and waits
#      until their sandboxes run and NRI recorded them;
#   5. prints `podres-proxy query list` (the proxy), the kubelet's own
#      answer for comparison, and `podres-proxy inspect`.
#
# Usage: hack/local-up.sh (as root)        (hack/local-down.sh stops everything)
# Environment:
#   PODRES_LOCAL_ROOT     where the node lives (default /var/tmp/podres-local)
#   PODRES_METRICS_PORT   podres-proxy's /metrics port on 127.0.0.1 (default 9477)
#   and hack/node-up.sh's settings (ports, node name, subnet).
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root

ROOT="${PODRES_LOCAL_ROOT:-/var/tmp/podres-local}"
METRICS_PORT="${PODRES_METRICS_PORT:-9477}"
HACK="${PODRES_REPO}/hack"

if [[ -f "${ROOT}/pids" ]]; then
	log "a node is already up under ${ROOT}: stopping it first"
	"${HACK}/local-down.sh"
fi
mkdir -p "${ROOT}"
ROOT="$(cd "${ROOT}" && pwd)"

"${HACK}/build-node.sh"
"${HACK}/node-up.sh" "${ROOT}"
load_node_env
# shellcheck disable=SC2034 # read by lib.sh (start_component, await)
PIDS="${ROOT}/pids"

log "building podres-proxy"
mkdir -p "${ROOT}/bin"
(cd "${PODRES_REPO}" && "$(go_bin)" build -o "${ROOT}/bin/podres-proxy-bin" ./cmd/podres-proxy)
PROXY_SOCK="${ROOT}/proxy/pod-resources/kubelet.sock"
cat >"${ROOT}/bin/podres-proxy" <<SCRIPT
#!/usr/bin/env bash
# Written by hack/local-up.sh: podres-proxy serve against the local node.
exec "${ROOT}/bin/podres-proxy-bin" serve \\
	--socket "${PROXY_SOCK}" \\
	--kubelet-socket "${POD_RESOURCES_SOCK}" \\
	--kubelet-pods-url "http://127.0.0.1:${KUBELET_READONLY_PORT}/pods" \\
	--kubelet-pods-api-socket "${PODS_API_SOCK}" \\
	--state-dir "${ROOT}/state" \\
	--prune-after 1m \\
	--nri-socket "${NRI_SOCK}" \\
	--cri-socket "unix://${CONTAINERD_SOCK}" \\
	--metrics-addr "127.0.0.1:${METRICS_PORT}" \\
	--device-cr=false
SCRIPT
chmod +x "${ROOT}/bin/podres-proxy"
start_component podres-proxy
await podres-proxy "podres-proxy serving" curl -fsS "http://127.0.0.1:${METRICS_PORT}/readyz"

log "starting the demo pods (hack/demo)"
demo_pods=0
for f in "${HACK}"/demo/*.yaml; do
	sed "s|PAUSE_IMAGE|${PAUSE_IMAGE}|g" "${f}" >"${MANIFESTS}/$(basename "${f}")"
	demo_pods=$((demo_pods + 1))
done

# live_pods succeeds once the kubelet runs every container of every demo pod
# and NRI has recorded each of those containers as running in the store.
live_pods() {
	local running recorded
	running="$(curl -fsS "http://127.0.0.1:${KUBELET_READONLY_PORT}/pods" |
		jq '[.items[] | select(.metadata.namespace == "demo" and .status.phase == "Running")
			| (.status.containerStatuses // []) + (.status.initContainerStatuses // [])
			| map(select(.state.running)) | length] | add // 0')"
	recorded="$("${ROOT}/bin/podres-proxy-bin" inspect --state-dir "${ROOT}/state" -o json |
		jq '[.[] | select(.namespace == "demo" and .state == "ready") | .containers[] | select(.state == "running")] | length')"
	# 6 containers: trainer, worker, app, and inference's sidecar, web and model server.
	((running >= 6 && recorded >= running))
}
await podres-proxy "${demo_pods} demo pods running and recorded" live_pods

proxy() { "${ROOT}/bin/podres-proxy-bin" "$@"; }
printf '\n$ podres-proxy query list --socket %s\n' "${PROXY_SOCK}"
proxy query list --socket "${PROXY_SOCK}"
printf '\nThe kubelet itself knows none of those devices:\n$ podres-proxy query list --socket %s\n' "${POD_RESOURCES_SOCK}"
proxy query list --socket "${POD_RESOURCES_SOCK}"
printf '\n$ podres-proxy inspect --state-dir %s\n' "${ROOT}/state"
proxy inspect --state-dir "${ROOT}/state"
cat <<DONE

The node runs under ${ROOT} (logs in ${LOGS}). Try:
  ${ROOT}/bin/podres-proxy-bin query get demo/inference-${NODE_NAME} --socket ${PROXY_SOCK} -o json
  curl -s http://127.0.0.1:${METRICS_PORT}/metrics | grep podres_proxy_
  cat ${ROOT}/state/pods/*.json | jq .
Drop more pod manifests into ${MANIFESTS}; stop everything with hack/local-down.sh.
DONE

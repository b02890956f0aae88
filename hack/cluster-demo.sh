#!/usr/bin/env bash
# cluster-demo.sh installs podres-proxy on the cluster hack/cluster-up.sh
# started, as a user does (`kubectl apply -k deploy/base`), waits until the
# DaemonSet is Ready through its probes, creates the demo pods (hack/demo)
# through the API, bound to the node as Koordinator's scheduler binds them,
# and prints what podres-proxy answers next to what the kubelet answers.
# cluster-up.sh runs it unless PODRES_CLUSTER_DEPLOY=0.
#
# Usage: hack/cluster-demo.sh (as root)     (PODRES_CLUSTER_ROOT as for cluster-up.sh)
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root
ROOT="${PODRES_CLUSTER_ROOT:-/var/tmp/podres-cluster}"
[[ -f "${ROOT}/cluster.env" ]] || die "${ROOT}/cluster.env is missing: run hack/cluster-up.sh first"
# shellcheck source=/dev/null
source "${ROOT}/cluster.env"
TIMEOUT="${PODRES_UP_TIMEOUT:-120}"

kubectl_() {
	"${KUBECTL}" --kubeconfig "${KUBECONFIG_ADMIN}" "$@"
}

log "kubectl apply -k deploy/base"
kubectl_ apply -k "${PODRES_REPO}/deploy/base" >&2
log "waiting for DaemonSet podres-proxy/podres-proxy to be Ready (its readiness probe asks /readyz)"
kubectl_ -n podres-proxy rollout status daemonset/podres-proxy --timeout "${TIMEOUT}s" >&2 ||
	die "the DaemonSet did not become Ready; kubectl -n podres-proxy describe pods, and logs in ${LOGS}/pods"

log "creating the demo pods (hack/demo) through the API"
kubectl_ create namespace demo --dry-run=client -o yaml | kubectl_ apply -f - >&2
for f in "${PODRES_REPO}"/hack/demo/*.yaml; do
	# Bound to the node as koord-scheduler binds: the pods name a scheduler
	# that does not run here, so spec.nodeName is set at creation.
	sed -e "s|PAUSE_IMAGE|${PAUSE_IMAGE}|g" -e "s|^spec:$|spec:\n  nodeName: ${NODE_NAME}|" "${f}" |
		kubectl_ apply -f - >&2
done
kubectl_ -n demo wait --for=condition=Ready pod --all --timeout "${TIMEOUT}s" >&2

proxy() { "${ROOT}/images/podres-proxy" "$@"; }
printf '\n$ podres-proxy query list --socket %s/kubelet.sock\n' "${PROXY_SOCKET_DIR}"
proxy query list --socket "${PROXY_SOCKET_DIR}/kubelet.sock"
printf '\nThe kubelet itself knows none of those devices:\n$ podres-proxy query list --socket %s\n' "${POD_RESOURCES_SOCK}"
proxy query list --socket "${POD_RESOURCES_SOCK}"
cat <<DONE

A one-node cluster runs under ${ROOT} (logs in ${LOGS}), with podres-proxy
installed from deploy/base. Try:
  export KUBECONFIG=${KUBECONFIG_ADMIN}
  ${KUBECTL} get pods -A
  ${KUBECTL} -n podres-proxy logs daemonset/podres-proxy
  ${ROOT}/images/podres-proxy inspect --state-dir ${PROXY_STATE_DIR}
Stop everything with hack/cluster-down.sh.
DONE

#!/usr/bin/env bash
# node-up.sh starts a throwaway Kubernetes node under ROOT: containerd (with
# NRI and CNI) and a standalone kubelet (static pods only, no API server),
# from the artifacts hack/build-node.sh cached. Every process it starts is
# listed in ROOT/pids; hack/node-down.sh ROOT stops them all.
#
# Usage: hack/node-up.sh ROOT          (as root; ROOT is created if missing)
#
# Layout under ROOT:
#   containerd/   root, state, containerd.sock, config.toml
#   nri/          nri.sock, plugins/, conf.d/
#   cni/          net.d/ (the conflist), bin/ (extra plugins), ipam/
#   kubelet/      the kubelet's --root-dir (pod-resources/kubelet.sock,
#                 pods-api/pods-api.sock, ...)
#   manifests/    the kubelet's staticPodPath: drop pod manifests here
#   logs/         containerd.log, kubelet.log, pods/ (container logs)
#   node.env      the settings below, as KEY=VALUE lines
#   pids          "NAME PID" of each process started
#
# Settings (environment):
#   PODRES_NODE_NAME              node name (default podres-node); static
#                                 pods are named NAME-<node name>
#   PODRES_KUBELET_ROOT           the kubelet's --root-dir (default ROOT/kubelet)
#   PODRES_KUBELET_PORT           kubelet HTTPS port (default 10250)
#   PODRES_KUBELET_READONLY_PORT  kubelet read-only HTTP port (default 10255)
#   PODRES_KUBELET_HEALTHZ_PORT   kubelet healthz port (default 10248)
#   PODRES_KUBELET_VERBOSITY      kubelet --v (default 2)
#   PODRES_KUBELET_PODS_API       1: the kubelet serves its Pods API on
#                                 <kubelet root>/pods-api/pods-api.sock
#                                 (default 1: the PodsAPI gate's default from
#                                 1.37, set on 1.36); 0: it does not, the
#                                 kubelet as most clusters run it today (pods
#                                 only on /pods; the gate set off from 1.37)
#   PODRES_CNI_NETWORK            CNI network name (default podres-<node name>)
#   PODRES_CNI_BRIDGE             bridge device (default podres0; at most 15 chars)
#   PODRES_CNI_SUBNET             pod subnet (default 10.88.77.0/24)
#   PODRES_CNI_META_PLUGIN        a JSON object: a Multus-like plugin that
#                                 becomes the conflist's only plugin, with the
#                                 bridge plugin's config as its "delegate"
#   PODRES_CNI_BIN_DIR            extra CNI plugin directory, searched before
#                                 /usr/lib/cni (default ROOT/cni/bin)
#   PODRES_UP_TIMEOUT             seconds to wait for each part (default 120)
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
}

[[ $# -eq 1 && "$1" != -* ]] || usage
require_root
mkdir -p "$1"
ROOT="$(cd "$1" && pwd)"
[[ "${ROOT}" != / ]] || die "refusing to use / as a node root"

NODE_NAME="${PODRES_NODE_NAME:-podres-node}"
KUBELET_ROOT="${PODRES_KUBELET_ROOT:-${ROOT}/kubelet}"
KUBELET_PORT="${PODRES_KUBELET_PORT:-10250}"
KUBELET_READONLY_PORT="${PODRES_KUBELET_READONLY_PORT:-10255}"
KUBELET_HEALTHZ_PORT="${PODRES_KUBELET_HEALTHZ_PORT:-10248}"
KUBELET_VERBOSITY="${PODRES_KUBELET_VERBOSITY:-2}"
KUBELET_PODS_API="${PODRES_KUBELET_PODS_API:-1}"
CNI_NETWORK="${PODRES_CNI_NETWORK:-podres-${NODE_NAME}}"
CNI_BRIDGE="${PODRES_CNI_BRIDGE:-podres0}"
CNI_SUBNET="${PODRES_CNI_SUBNET:-10.88.77.0/24}"
CNI_META_PLUGIN="${PODRES_CNI_META_PLUGIN:-}"
CNI_BIN_DIR="${PODRES_CNI_BIN_DIR:-${ROOT}/cni/bin}"
UP_TIMEOUT="${PODRES_UP_TIMEOUT:-120}"

CONTAINERD_DIR="${ROOT}/containerd"
CONTAINERD_SOCK="${CONTAINERD_DIR}/containerd.sock"
NRI_DIR="${ROOT}/nri"
NRI_SOCK="${NRI_DIR}/nri.sock"
CNI_CONF_DIR="${ROOT}/cni/net.d"
MANIFESTS="${ROOT}/manifests"
LOGS="${ROOT}/logs"
PIDS="${ROOT}/pids"
POD_RESOURCES_SOCK="${KUBELET_ROOT}/pod-resources/kubelet.sock"
# Where the kubelet serves its Pods API when KUBELET_PODS_API is 1.
PODS_API_SOCK="${KUBELET_ROOT}/pods-api/pods-api.sock"
# The kubelet's device manager ignores --root-dir: its registration socket
# and checkpoint always live here (pkg/kubelet/cm/devicemanager).
HOST_DEVICE_PLUGIN_DIR=/var/lib/kubelet/device-plugins

# check_artifacts dies unless build-node.sh has built everything.
check_artifacts() {
	local f
	for f in "${CONTAINERD_BIN_DIR}/containerd" "${CONTAINERD_BIN_DIR}/ctr" \
		"${CONTAINERD_BIN_DIR}/containerd-shim-runc-v2" "${KUBELET_BIN}" \
		"$(pause_cache_dir)/pause.tar" /usr/sbin/runc "${CNI_SYSTEM_BIN_DIR}/bridge"; do
		[[ -e "${f}" ]] || die "missing ${f}: run hack/build-node.sh first"
	done
	((${#CNI_BRIDGE} <= 15)) || die "PODRES_CNI_BRIDGE '${CNI_BRIDGE}' is longer than 15 characters"
	[[ "${KUBELET_PODS_API}" =~ ^[01]$ ]] || die "PODRES_KUBELET_PODS_API is '${KUBELET_PODS_API}'; want 0 or 1"
}

# prepare_root stops a node left running under ROOT and clears its runtime
# state, keeping the previous logs in logs.prev.
prepare_root() {
	if [[ -s "${PIDS}" || -f "${ROOT}/node.env" ]]; then
		log "${ROOT} held a node: making sure it is down first"
		"${PODRES_REPO}/hack/node-down.sh" "${ROOT}"
	fi
	if [[ -d "${LOGS}" ]]; then
		rm -rf "${LOGS}.prev"
		mv "${LOGS}" "${LOGS}.prev"
	fi
	rm -rf "${CONTAINERD_DIR}" "${NRI_DIR}" "${ROOT}/cni/net.d" "${ROOT}/cni/ipam" "${ROOT}/runc"
	if [[ -z "${PODRES_KUBELET_ROOT:-}" ]]; then
		rm -rf "${KUBELET_ROOT}"
	fi
	mkdir -p "${CONTAINERD_DIR}" "${NRI_DIR}/plugins" "${NRI_DIR}/conf.d" "${CNI_CONF_DIR}" \
		"${CNI_BIN_DIR}" "${ROOT}/cni/ipam" "${KUBELET_ROOT}" "${MANIFESTS}" "${LOGS}/pods"
	: >"${PIDS}"
}

# write_node_env records the node's settings for node-down.sh and the tests.
write_node_env() {
	local host_dp_created=0
	[[ -d "${HOST_DEVICE_PLUGIN_DIR}" ]] || host_dp_created=1
	{
		echo "# written by hack/node-up.sh"
		local k
		for k in ROOT NODE_NAME KUBELET_ROOT KUBELET_PORT KUBELET_READONLY_PORT KUBELET_HEALTHZ_PORT \
			CNI_NETWORK CNI_BRIDGE CNI_SUBNET CNI_BIN_DIR CNI_CONF_DIR CONTAINERD_SOCK NRI_SOCK \
			MANIFESTS LOGS POD_RESOURCES_SOCK KUBELET_PODS_API PODS_API_SOCK CONTAINERD_VERSION KUBERNETES_VERSION; do
			printf '%s=%q\n' "${k}" "${!k}"
		done
		printf 'PAUSE_IMAGE=%q\n' "$(cat "$(pause_cache_dir)/image-name")"
		# What the binaries say of themselves, for the suites' logs.
		printf 'KUBELET_VERSION=%q\n' "$("${KUBELET_BIN}" --version | awk '{print $NF}')"
		printf 'CONTAINERD_BUILD=%q\n' "$("${CONTAINERD_BIN_DIR}/containerd" --version | awk '{print $3}')"
		printf 'HOST_DEVICE_PLUGIN_DIR_CREATED=%q\n' "${host_dp_created}"
	} >"${ROOT}/node.env"
}

write_kubelet_config() {
	local gates
	gates="$(pods_api_gate "${KUBELET_PODS_API}")"
	cat >"${ROOT}/kubelet-config.yaml" <<EOF
# written by hack/node-up.sh: a standalone kubelet for tests only
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://${CONTAINERD_SOCK}
staticPodPath: ${MANIFESTS}
fileCheckFrequency: 1s
syncFrequency: 10s
address: 127.0.0.1
port: ${KUBELET_PORT}
readOnlyPort: ${KUBELET_READONLY_PORT}
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
${gates}
$(kubelet_config_common)
EOF
}

# write_start_scripts writes ROOT/bin/containerd and ROOT/bin/kubelet, which
# exec the component with the node's settings; node-restart.sh reuses them.
write_start_scripts() {
	mkdir -p "${ROOT}/bin"
	cat >"${ROOT}/bin/containerd" <<EOF
#!/bin/sh
# written by hack/node-up.sh
export PATH='${CONTAINERD_BIN_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
exec '${CONTAINERD_BIN_DIR}/containerd' --config '${CONTAINERD_DIR}/config.toml'
EOF
	cat >"${ROOT}/bin/kubelet" <<EOF
#!/bin/sh
# written by hack/node-up.sh
exec '${KUBELET_BIN}' --config '${ROOT}/kubelet-config.yaml' --root-dir '${KUBELET_ROOT}' \
	--cert-dir '${KUBELET_ROOT}/pki' --hostname-override '${NODE_NAME}' --v '${KUBELET_VERBOSITY}'
EOF
	chmod +x "${ROOT}/bin/containerd" "${ROOT}/bin/kubelet"
}

main() {
	local start_time
	start_time="$(date +%s)"
	check_artifacts
	prepare_root
	write_node_env
	write_containerd_config
	write_cni_config PODRES_CNI_META_PLUGIN
	write_kubelet_config
	write_start_scripts
	log "node ${NODE_NAME} under ${ROOT} (containerd ${CONTAINERD_VERSION}, kubelet ${KUBERNETES_VERSION}, PodsAPI gate $( ((KUBELET_PODS_API)) && echo on || echo off))"

	start_component containerd
	await_containerd
	ctr_ -n k8s.io images import --local --snapshotter native "$(pause_cache_dir)/pause.tar" >>"${LOGS}/ctr.log" 2>&1 ||
		die "importing the pause image failed (see ${LOGS}/ctr.log)"
	log "pause image $(cat "$(pause_cache_dir)/image-name") imported"

	start_component kubelet
	await_kubelet
	log "node ${NODE_NAME} is up in $(($(date +%s) - start_time))s; static pods go in ${MANIFESTS}"
}

main "$@"

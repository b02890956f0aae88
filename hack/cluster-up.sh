#!/usr/bin/env bash
# cluster-up.sh starts a throw-away one-node Kubernetes cluster on this
# machine, with the security a real one has, from the artifacts
# hack/build-cluster.sh cached (it runs it first):
#
#   - certificates from a throw-away CA (openssl) under ROOT/pki;
#   - etcd on 127.0.0.1;
#   - kube-apiserver with Node,RBAC authorization, NodeRestriction,
#     service-account token signing, and the cluster CA verifying the
#     kubelet's serving certificate;
#   - kube-controller-manager (service-account credentials per controller,
#     the root CA published as kube-root-ca.crt) and kube-scheduler;
#   - containerd with NRI and a CNI bridge network;
#   - a kubelet registered as node NODE with a client certificate
#     (system:node:NODE), anonymous access off, --authentication-token-webhook
#     and --authorization-mode=Webhook, serving with a certificate the cluster
#     CA signed, and its PodsAPI feature gate on (the Pods API of KEP-4188 on
#     /var/lib/kubelet/pods-api/pods-api.sock);
#   - the podres-proxy image (hack/ociimage; no container engine needed)
#     imported into containerd's k8s.io namespace as
#     docker.io/library/podres-proxy:latest, the name deploy/base's DaemonSet
#     asks for.
#
# The node uses the paths deploy/base mounts, as a real node does: the
# kubelet's root is /var/lib/kubelet, containerd listens on
# /run/containerd/containerd.sock (made a shared mount, which the DaemonSet's
# HostToContainer propagation needs), NRI on /var/run/nri/nri.sock. So only
# one such cluster can run on a machine, and not beside another kubelet whose
# root is /var/lib/kubelet. Its own state lives under ROOT; everything else it
# creates is listed in ROOT/cluster.env, and hack/cluster-down.sh removes it
# all (processes, mounts, the bridge, the iptables chain).
#
# No kube-proxy: the kubernetes Service's ClusterIP is DNATed to the API
# server by one rule in the iptables chain PODRES-CLUSTER (nat table).
#
# Then (unless PODRES_CLUSTER_DEPLOY=0) hack/cluster-demo.sh installs
# podres-proxy with `kubectl apply -k deploy/base`, waits for the DaemonSet,
# creates the demo pods through the API and prints the merged answer.
#
# Usage: hack/cluster-up.sh (as root)            (hack/cluster-down.sh stops it)
#
# Settings (environment):
#   PODRES_CLUSTER_ROOT        the cluster's directory (default /var/tmp/podres-cluster)
#   PODRES_CLUSTER_NODE        node name (default podres-cluster)
#   PODRES_CLUSTER_NODE_IP     the node's IP (default: the source address of the
#                              default route)
#   PODRES_CLUSTER_API_PORT    the API server's port (default 16443)
#   PODRES_CLUSTER_ETCD_PORT   etcd's client port on 127.0.0.1 (default 12379; the
#                              peer port is the next one)
#   PODRES_CLUSTER_BRIDGE      the CNI bridge (default podresc0)
#   PODRES_CLUSTER_SUBNET      the pod subnet (default 10.88.78.0/24)
#   PODRES_CLUSTER_SERVICE_CIDR  Service IPs (default 10.97.0.0/24)
#   PODRES_CLUSTER_CNI_META_PLUGIN  a JSON object: a Multus-like plugin that
#                              becomes the conflist's only plugin, with the
#                              bridge plugin's config as its "delegate"
#   PODRES_CLUSTER_CNI_BIN_DIR extra CNI plugin directory (default ROOT/cni/bin)
#   PODRES_CLUSTER_AUTHZ_TTL   the kubelet's webhook authorization cache, for
#                              allowed and denied answers (default 5s; a
#                              kubelet's default is 5m and 30s)
#   PODRES_IMAGE_TAGS          extra tags of the podres-proxy image to import
#                              (space-separated; e.g. "v2" for a rolling update),
#                              each an image of its own (a config label names
#                              the tag), so a rollout to it gets a new image
#   PODRES_UP_TIMEOUT          seconds to wait for each part (default 120)
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
}
[[ $# -eq 0 ]] || usage
require_root

ROOT="${PODRES_CLUSTER_ROOT:-/var/tmp/podres-cluster}"
mkdir -p "${ROOT}"
ROOT="$(cd "${ROOT}" && pwd)"
[[ "${ROOT}" != / ]] || die "refusing to use / as the cluster's root"
NODE_NAME="${PODRES_CLUSTER_NODE:-podres-cluster}"
NODE_IP="${PODRES_CLUSTER_NODE_IP:-}"
API_PORT="${PODRES_CLUSTER_API_PORT:-16443}"
ETCD_PORT="${PODRES_CLUSTER_ETCD_PORT:-12379}"
CNI_BRIDGE="${PODRES_CLUSTER_BRIDGE:-podresc0}"
CNI_SUBNET="${PODRES_CLUSTER_SUBNET:-10.88.78.0/24}"
SERVICE_CIDR="${PODRES_CLUSTER_SERVICE_CIDR:-10.97.0.0/24}"
CNI_META_PLUGIN="${PODRES_CLUSTER_CNI_META_PLUGIN:-}"
CNI_BIN_DIR="${PODRES_CLUSTER_CNI_BIN_DIR:-${ROOT}/cni/bin}"
AUTHZ_TTL="${PODRES_CLUSTER_AUTHZ_TTL:-5s}"
IMAGE_TAGS="latest ${PODRES_IMAGE_TAGS:-}"
UP_TIMEOUT="${PODRES_UP_TIMEOUT:-120}"
CNI_NETWORK="podres-cluster"
# The kubelet's healthz, the controller-manager's and the scheduler's secure
# ports: all on 127.0.0.1, away from their defaults.
KUBELET_HEALTHZ_PORT=10348
KCM_PORT=10357
SCHEDULER_PORT=10359

# The node's paths that deploy/base mounts (see the header).
KUBELET_ROOT=/var/lib/kubelet
CONTAINERD_RUN=/run/containerd
CONTAINERD_SOCK="${CONTAINERD_RUN}/containerd.sock"
NRI_SOCK=/var/run/nri/nri.sock
POD_RESOURCES_SOCK="${KUBELET_ROOT}/pod-resources/kubelet.sock"
PODS_API_SOCK="${KUBELET_ROOT}/pods-api/pods-api.sock"
PROXY_SOCKET_DIR=/var/run/podres-proxy/pod-resources
PROXY_STATE_DIR=/var/lib/podres-proxy
# The kubelet keeps pod logs in LOGS/pods (collected with the logs); this is
# the same directory, bind-mounted where deploy/base reads the kubelet's
# podLogsDir (--kubelet-pod-logs-dir's default).
HOST_POD_LOGS=/var/log/pods

PKI="${ROOT}/pki"
LOGS="${ROOT}/logs"
PIDS="${ROOT}/pids"
KUBECONFIG_ADMIN="${ROOT}/admin.conf"
CONTAINERD_DIR="${ROOT}/containerd"
NRI_DIR="${ROOT}/nri"
CNI_CONF_DIR="${ROOT}/cni/net.d"

check_artifacts() {
	local f
	for f in "${CONTAINERD_BIN_DIR}/containerd" "${CONTAINERD_BIN_DIR}/ctr" \
		"${CONTAINERD_BIN_DIR}/containerd-shim-runc-v2" "${KUBELET_BIN}" "${ETCD_BIN}" \
		"${CONTROL_PLANE_BIN_DIR}/kube-apiserver" "${CONTROL_PLANE_BIN_DIR}/kube-controller-manager" \
		"${CONTROL_PLANE_BIN_DIR}/kube-scheduler" "${CONTROL_PLANE_BIN_DIR}/kubectl" \
		"$(pause_cache_dir)/pause.tar" /usr/sbin/runc "${CNI_SYSTEM_BIN_DIR}/bridge"; do
		[[ -e "${f}" ]] || die "missing ${f}: run hack/build-cluster.sh first"
	done
	command -v openssl >/dev/null || die "openssl is missing (apt-get install openssl)"
	((${#CNI_BRIDGE} <= 15)) || die "PODRES_CLUSTER_BRIDGE '${CNI_BRIDGE}' is longer than 15 characters"
	if [[ -S "${POD_RESOURCES_SOCK}" ]] && pgrep -x kubelet >/dev/null; then
		die "a kubelet already serves ${POD_RESOURCES_SOCK}: one cluster per machine (hack/cluster-down.sh?)"
	fi
}

# default_node_ip prints the source address of the default route.
default_node_ip() {
	ip -4 route get 1.1.1.1 2>/dev/null | sed -n -E 's/.* src ([0-9.]+).*/\1/p' | head -n 1
}

# prepare_root stops a cluster left running under ROOT and clears its state,
# keeping the previous logs in logs.prev.
prepare_root() {
	if [[ -s "${PIDS}" || -f "${ROOT}/cluster.env" ]]; then
		log "${ROOT} held a cluster: making sure it is down first"
		"${PODRES_REPO}/hack/cluster-down.sh"
	fi
	if [[ -d "${LOGS}" ]]; then
		rm -rf "${LOGS}.prev"
		mv "${LOGS}" "${LOGS}.prev"
	fi
	rm -rf "${PKI}" "${ROOT}/etcd" "${CONTAINERD_DIR}" "${NRI_DIR}" "${CNI_CONF_DIR}" "${ROOT}/cni/ipam" \
		"${ROOT:?}/runc" "${ROOT:?}/images" "${ROOT:?}/bin" "${ROOT}"/*.conf "${ROOT}"/*.yaml
	mkdir -p "${PKI}" "${CONTAINERD_DIR}" "${NRI_DIR}/plugins" "${NRI_DIR}/conf.d" "${CNI_CONF_DIR}" \
		"${CNI_BIN_DIR}" "${ROOT}/cni/ipam" "${LOGS}/pods" "${ROOT}/bin" "${ROOT}/images"
	: >"${PIDS}"
}

# note_created DIR creates DIR when missing and, if it did, records it in
# ROOT/created so that cluster-down.sh removes it again.
note_created() {
	if [[ ! -e "$1" ]]; then
		mkdir -p "$1"
		echo "$1" >>"${ROOT}/created"
	fi
}

prepare_host() {
	: >"${ROOT}/created"
	local d
	# Another kubelet's device manager may have made /var/lib/kubelet (it
	# ignores --root-dir); then what is in it now is not this cluster's.
	rm -f "${ROOT}/kubelet-root-before"
	if [[ -d "${KUBELET_ROOT}" ]]; then
		ls -A "${KUBELET_ROOT}" >"${ROOT}/kubelet-root-before"
	fi
	for d in "${KUBELET_ROOT}" "$(dirname "${NRI_SOCK}")" "$(dirname "${PROXY_SOCKET_DIR}")" "${PROXY_STATE_DIR}" "${CONTAINERD_RUN}"; do
		note_created "${d}"
	done
	# HostToContainer propagation (the DaemonSet's /run/containerd mount)
	# needs the host path on a shared or slave mount, as on systemd hosts.
	: >"${ROOT}/bind-mounts"
	if ! findmnt -n -o PROPAGATION -T "${CONTAINERD_RUN}" | grep -q shared; then
		mount --bind "${CONTAINERD_RUN}" "${CONTAINERD_RUN}"
		mount --make-shared "${CONTAINERD_RUN}"
		echo "${CONTAINERD_RUN}" >>"${ROOT}/bind-mounts"
		log "${CONTAINERD_RUN}: bind-mounted onto itself as a shared mount"
	fi
	# The kubelet's pod logs, where deploy/base reads them, unless the
	# host has that directory already (another kubelet's, or a run that
	# was not taken down): it is left alone, and serve, finding no running
	# pod's logs there, reads /pods for pods not running at every query.
	if [[ -e "${HOST_POD_LOGS}" ]]; then
		log "${HOST_POD_LOGS} was there before: left alone (serve's --kubelet-pod-logs-dir falls back to reading /pods)"
	else
		note_created "${HOST_POD_LOGS}"
		mount --bind "${LOGS}/pods" "${HOST_POD_LOGS}"
		echo "${HOST_POD_LOGS}" >>"${ROOT}/bind-mounts"
	fi
	# The daemon's state store starts empty in every cluster: a store that
	# was there before (not made above) is covered by one under ROOT.
	if ! grep -qxF "${PROXY_STATE_DIR}" "${ROOT}/created"; then
		rm -rf "${ROOT}/podres-proxy-state"
		mkdir -p "${ROOT}/podres-proxy-state"
		mount --bind "${ROOT}/podres-proxy-state" "${PROXY_STATE_DIR}"
		echo "${PROXY_STATE_DIR}" >>"${ROOT}/bind-mounts"
		log "${PROXY_STATE_DIR} was there before: covered by ${ROOT}/podres-proxy-state for this cluster"
	fi
}

write_cluster_env() {
	{
		echo "# written by hack/cluster-up.sh"
		local k
		for k in ROOT NODE_NAME NODE_IP SERVICE_IP API_PORT ETCD_PORT CNI_NETWORK CNI_BRIDGE CNI_SUBNET SERVICE_CIDR \
			CNI_BIN_DIR CNI_CONF_DIR CONTAINERD_SOCK NRI_SOCK KUBELET_ROOT POD_RESOURCES_SOCK PODS_API_SOCK \
			PROXY_SOCKET_DIR PROXY_STATE_DIR LOGS KUBECONFIG_ADMIN KUBELET_HEALTHZ_PORT \
			CONTAINERD_VERSION KUBERNETES_VERSION ETCD_VERSION CONTROL_PLANE_BIN_DIR; do
			printf '%s=%q\n' "${k}" "${!k}"
		done
		printf 'PAUSE_IMAGE=%q\n' "$(cat "$(pause_cache_dir)/image-name")"
		printf 'KUBECTL=%q\n' "${CONTROL_PLANE_BIN_DIR}/kubectl"
		printf 'CTR=%q\n' "${CONTAINERD_BIN_DIR}/ctr"
		# node-down.sh's settings: it must leave the device manager's
		# directory to this script, which knows whether it made it.
		printf 'HOST_DEVICE_PLUGIN_DIR_CREATED=0\n'
	} >"${ROOT}/cluster.env"
	# hack/node-down.sh, which stops the node's part, reads node.env.
	cp "${ROOT}/cluster.env" "${ROOT}/node.env"
}

# ---------------------------------------------------------------------------
# Certificates

# sign NAME SUBJECT EXT: a 2048-bit RSA key and a certificate signed by the
# cluster CA, valid for a day, with the extensions EXT (openssl x509 syntax).
sign() {
	local name="$1" subject="$2" ext="$3"
	openssl req -new -newkey rsa:2048 -nodes -keyout "${PKI}/${name}.key" -subj "${subject}" \
		-out "${PKI}/${name}.csr" 2>/dev/null
	printf '%s\n' "${ext}" >"${PKI}/${name}.ext"
	openssl x509 -req -in "${PKI}/${name}.csr" -CA "${PKI}/ca.crt" -CAkey "${PKI}/ca.key" \
		-CAcreateserial -days 1 -sha256 -extfile "${PKI}/${name}.ext" -out "${PKI}/${name}.crt" 2>/dev/null
	rm -f "${PKI}/${name}.csr" "${PKI}/${name}.ext"
}

CLIENT_EXT='basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth'

# serving_ext SANS prints the extensions of a serving certificate.
serving_ext() {
	printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n'
	printf 'extendedKeyUsage=serverAuth\nsubjectAltName=%s\n' "$1"
}

# kubeconfig NAME USER writes ROOT/NAME.conf for the certificate pki/USER.
kubeconfig() {
	local file="${ROOT}/$1.conf" user="$2"
	cat >"${file}" <<EOF
# written by hack/cluster-up.sh
apiVersion: v1
kind: Config
clusters:
- name: podres-cluster
  cluster:
    server: https://${NODE_IP}:${API_PORT}
    certificate-authority: ${PKI}/ca.crt
users:
- name: ${user}
  user:
    client-certificate: ${PKI}/${user}.crt
    client-key: ${PKI}/${user}.key
contexts:
- name: podres-cluster
  context:
    cluster: podres-cluster
    user: ${user}
current-context: podres-cluster
EOF
	chmod 600 "${file}"
}

write_pki() {
	local service_ip
	# The first address of the Service range: the kubernetes Service's.
	service_ip="$(awk -F'[./]' '{ printf "%d.%d.%d.%d", $1, $2, $3, $4 + 1 }' <<<"${SERVICE_CIDR}")"
	SERVICE_IP="${service_ip}"
	openssl req -x509 -new -newkey rsa:2048 -nodes -days 1 -sha256 -subj "/CN=podres-cluster-ca" \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
		-keyout "${PKI}/ca.key" -out "${PKI}/ca.crt" 2>/dev/null
	sign apiserver "/CN=kube-apiserver" "$(serving_ext "IP:${NODE_IP},IP:${service_ip},IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")"
	sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "${CLIENT_EXT}"
	sign admin "/O=system:masters/CN=podres-cluster-admin" "${CLIENT_EXT}"
	sign controller-manager "/CN=system:kube-controller-manager" "${CLIENT_EXT}"
	sign scheduler "/CN=system:kube-scheduler" "${CLIENT_EXT}"
	sign kubelet-client "/O=system:nodes/CN=system:node:${NODE_NAME}" "${CLIENT_EXT}"
	sign kubelet-serving "/O=system:nodes/CN=system:node:${NODE_NAME}" "$(serving_ext "IP:${NODE_IP},DNS:${NODE_NAME}")"
	# The service-account token signing key pair.
	openssl genrsa -out "${PKI}/sa.key" 2048 2>/dev/null
	openssl rsa -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null
	chmod 600 "${PKI}"/*.key
	kubeconfig admin admin
	kubeconfig controller-manager controller-manager
	kubeconfig scheduler scheduler
	kubeconfig kubelet kubelet-client
	log "certificates: a throw-away CA and 7 certificates in ${PKI}"
}

# ---------------------------------------------------------------------------
# Configuration of each component

# write_kubelet_config writes the kubelet's configuration. Its PodsAPI gate
# is on (the default from 1.37, set on 1.36), so the kubelet serves its Pods API on PODS_API_SOCK, which
# deploy/base's DaemonSet mounts and serve prefers to /pods. The cluster suite
# runs both of serve's pod sources on this one kubelet: deploy/base as
# installed watches the Pods API; with --kubelet-pods-api-socket= (the DRA
# test's overlay, the RBAC test's patched DaemonSet, the Helm chart's
# podsAPI.enabled: false) serve reads /pods over HTTPS with its token and
# RBAC, as on a kubelet without the gate.
write_kubelet_config() {
	local gates
	gates="$(pods_api_gate 1)"
	cat >"${ROOT}/kubelet-config.yaml" <<EOF
# written by hack/cluster-up.sh
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://${CONTAINERD_SOCK}
address: ${NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
tlsCertFile: ${PKI}/kubelet-serving.crt
tlsPrivateKeyFile: ${PKI}/kubelet-serving.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ${PKI}/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: ${AUTHZ_TTL}
    cacheUnauthorizedTTL: ${AUTHZ_TTL}
clusterDomain: cluster.local
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
makeIPTablesUtilChains: false
${gates}
$(kubelet_config_common)
EOF
}

# write_start_scripts writes ROOT/bin/NAME for each component: a script that
# execs it with the cluster's settings.
write_start_scripts() {
	local cp="${CONTROL_PLANE_BIN_DIR}"
	start_script containerd "export PATH='${CONTAINERD_BIN_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
exec '${CONTAINERD_BIN_DIR}/containerd' --config '${CONTAINERD_DIR}/config.toml'"
	start_script etcd "exec '${ETCD_BIN}' --name podres-cluster --data-dir '${ROOT}/etcd' \\
	--listen-client-urls 'http://127.0.0.1:${ETCD_PORT}' --advertise-client-urls 'http://127.0.0.1:${ETCD_PORT}' \\
	--listen-peer-urls 'http://127.0.0.1:$((ETCD_PORT + 1))' --initial-advertise-peer-urls 'http://127.0.0.1:$((ETCD_PORT + 1))' \\
	--initial-cluster 'podres-cluster=http://127.0.0.1:$((ETCD_PORT + 1))' --listen-metrics-urls '' \\
	--unsafe-no-fsync --quota-backend-bytes 1073741824"
	start_script kube-apiserver "exec '${cp}/kube-apiserver' --etcd-servers 'http://127.0.0.1:${ETCD_PORT}' \\
	--advertise-address '${NODE_IP}' --bind-address '${NODE_IP}' --secure-port '${API_PORT}' \\
	--tls-cert-file '${PKI}/apiserver.crt' --tls-private-key-file '${PKI}/apiserver.key' \\
	--client-ca-file '${PKI}/ca.crt' \\
	--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \\
	--anonymous-auth=false \\
	--service-account-issuer https://kubernetes.default.svc.cluster.local \\
	--service-account-key-file '${PKI}/sa.pub' --service-account-signing-key-file '${PKI}/sa.key' \\
	--service-cluster-ip-range '${SERVICE_CIDR}' \\
	--kubelet-client-certificate '${PKI}/apiserver-kubelet-client.crt' \\
	--kubelet-client-key '${PKI}/apiserver-kubelet-client.key' \\
	--kubelet-certificate-authority '${PKI}/ca.crt' \\
	--kubelet-preferred-address-types InternalIP \\
	--endpoint-reconciler-type lease --v 1"
	start_script kube-controller-manager "exec '${cp}/kube-controller-manager' \\
	--kubeconfig '${ROOT}/controller-manager.conf' \\
	--authentication-kubeconfig '${ROOT}/controller-manager.conf' \\
	--authorization-kubeconfig '${ROOT}/controller-manager.conf' \\
	--bind-address 127.0.0.1 --secure-port ${KCM_PORT} --leader-elect=false \\
	--use-service-account-credentials --service-account-private-key-file '${PKI}/sa.key' \\
	--root-ca-file '${PKI}/ca.crt' --cluster-signing-cert-file '${PKI}/ca.crt' \\
	--cluster-signing-key-file '${PKI}/ca.key' --service-cluster-ip-range '${SERVICE_CIDR}' \\
	--concurrent-statefulset-syncs 2 --v 1"
	start_script kube-scheduler "exec '${cp}/kube-scheduler' --kubeconfig '${ROOT}/scheduler.conf' \\
	--authentication-kubeconfig '${ROOT}/scheduler.conf' --authorization-kubeconfig '${ROOT}/scheduler.conf' \\
	--bind-address 127.0.0.1 --secure-port ${SCHEDULER_PORT} --leader-elect=false --v 1"
	start_script kubelet "exec '${KUBELET_BIN}' --config '${ROOT}/kubelet-config.yaml' --root-dir '${KUBELET_ROOT}' \\
	--kubeconfig '${ROOT}/kubelet.conf' --cert-dir '${PKI}/kubelet' --hostname-override '${NODE_NAME}' \\
	--node-ip '${NODE_IP}' --v 2"
}

# start_script NAME BODY writes ROOT/bin/NAME.
start_script() {
	printf '#!/bin/sh\n# written by hack/cluster-up.sh\n%s\n' "$2" >"${ROOT}/bin/$1"
	chmod +x "${ROOT}/bin/$1"
}

# ---------------------------------------------------------------------------
# Readiness

kubectl_() {
	"${CONTROL_PLANE_BIN_DIR}/kubectl" --kubeconfig "${KUBECONFIG_ADMIN}" "$@"
}

# https_ok URL CERT: the URL answers 200 to the cluster admin's certificate.
https_ok() {
	curl -fsS --max-time 2 --cacert "${PKI}/ca.crt" --cert "${PKI}/admin.crt" --key "${PKI}/admin.key" "$1"
}

node_ready() {
	[[ "$(kubectl_ get node "${NODE_NAME}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

service_account_ready() {
	kubectl_ -n default get serviceaccount default && kubectl_ -n default get configmap kube-root-ca.crt
}

# route_service_ip DNATs the kubernetes Service's ClusterIP to the API
# server, for pods and for the host network (the DaemonSet), in a chain of
# its own.
route_service_ip() {
	iptables -t nat -N PODRES-CLUSTER
	iptables -t nat -A PODRES-CLUSTER -d "${SERVICE_IP}/32" -p tcp --dport 443 \
		-m comment --comment "podres-cluster: the kubernetes Service" -j DNAT --to-destination "${NODE_IP}:${API_PORT}"
	iptables -t nat -I PREROUTING -j PODRES-CLUSTER
	iptables -t nat -I OUTPUT -j PODRES-CLUSTER
	log "iptables: ${SERVICE_IP}:443 -> ${NODE_IP}:${API_PORT} (chain PODRES-CLUSTER)"
}

import_images() {
	ctr_ -n k8s.io images import --local --snapshotter native "$(pause_cache_dir)/pause.tar" >>"${LOGS}/ctr.log" 2>&1 ||
		die "importing the pause image failed (see ${LOGS}/ctr.log)"
	local arch tag labels
	arch="$("$(go_bin)" env GOARCH)"
	log "podres-proxy image: building the binary as the Dockerfile does"
	(cd "${PODRES_REPO}" && CGO_ENABLED=0 "$(go_bin)" build -trimpath -ldflags "-s -w -X main.version=cluster" \
		-o "${ROOT}/images/podres-proxy" ./cmd/podres-proxy) || die "building podres-proxy failed"
	for tag in ${IMAGE_TAGS}; do
		# latest is the image `make image-oci` makes; every other tag differs
		# by a label, so containerd holds it as another image.
		labels=()
		if [[ "${tag}" != latest ]]; then
			labels=(--label "org.opencontainers.image.version=${tag}")
		fi
		(cd "${PODRES_REPO}" && "$(go_bin)" run ./hack/ociimage --binary "${ROOT}/images/podres-proxy" \
			--name "docker.io/library/podres-proxy:${tag}" --arch "${arch}" "${labels[@]}" \
			-o "${ROOT}/images/podres-proxy-${tag}.tar") ||
			die "packing the podres-proxy image failed"
		ctr_ -n k8s.io images import --local --snapshotter native "${ROOT}/images/podres-proxy-${tag}.tar" >>"${LOGS}/ctr.log" 2>&1 ||
			die "importing the podres-proxy image failed (see ${LOGS}/ctr.log)"
		log "image docker.io/library/podres-proxy:${tag} imported"
	done
}

main() {
	local start_time
	start_time="$(date +%s)"
	"${PODRES_REPO}/hack/build-cluster.sh"
	check_artifacts
	NODE_IP="${NODE_IP:-$(default_node_ip)}"
	[[ -n "${NODE_IP}" ]] || die "could not find the node's IP: set PODRES_CLUSTER_NODE_IP"
	prepare_root
	prepare_host
	write_pki
	write_cluster_env
	write_containerd_config
	write_cni_config PODRES_CLUSTER_CNI_META_PLUGIN
	write_kubelet_config
	write_start_scripts
	log "cluster ${NODE_NAME} under ${ROOT}: node IP ${NODE_IP}, API https://${NODE_IP}:${API_PORT}"

	start_component etcd
	await etcd "etcd on 127.0.0.1:${ETCD_PORT}" curl -fsS --max-time 2 "http://127.0.0.1:${ETCD_PORT}/health"
	start_component kube-apiserver
	await kube-apiserver "kube-apiserver on ${NODE_IP}:${API_PORT}" https_ok "https://${NODE_IP}:${API_PORT}/readyz"
	route_service_ip
	start_component kube-controller-manager
	start_component kube-scheduler
	start_component containerd
	await containerd "containerd on ${CONTAINERD_SOCK}" ctr_ version
	await containerd "NRI socket ${NRI_SOCK}" test -S "${NRI_SOCK}"
	import_images
	start_component kubelet
	await kube-controller-manager "kube-controller-manager healthz" curl -fsSk --max-time 2 "https://127.0.0.1:${KCM_PORT}/healthz"
	await kube-scheduler "kube-scheduler healthz" curl -fsSk --max-time 2 "https://127.0.0.1:${SCHEDULER_PORT}/healthz"
	await kubelet "node ${NODE_NAME} Ready" node_ready
	await kubelet "kubelet Pods API on ${PODS_API_SOCK}" pods_api_answers
	await kube-controller-manager "service account and kube-root-ca.crt in default" service_account_ready
	log "cluster up in $(($(date +%s) - start_time))s: export KUBECONFIG=${KUBECONFIG_ADMIN}; kubectl is ${CONTROL_PLANE_BIN_DIR}/kubectl"
	if [[ "${PODRES_CLUSTER_DEPLOY:-1}" != 0 ]]; then
		"${PODRES_REPO}/hack/cluster-demo.sh"
	fi
}

main "$@"

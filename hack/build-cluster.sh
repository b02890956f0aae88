#!/usr/bin/env bash
# build-cluster.sh builds everything hack/cluster-up.sh needs, caching each
# artifact under PODRES_CACHE keyed by version, so a second run takes seconds:
#
#   - what hack/build-node.sh builds (containerd, the kubelet, the pause
#     image, the Debian packages);
#   - etcd (ETCD_VERSION) into PODRES_CACHE/etcd-VERSION/bin;
#   - kube-apiserver, kube-controller-manager, kube-scheduler and kubectl
#     (KUBERNETES_VERSION) into PODRES_CACHE/control-plane-VERSION/bin;
#   - the DRA test driver of the cluster suite (hack/build-dradriver.sh).
#
# etcd and the control plane come from one `go build` in a generated wrapper
# module (as the kubelet's: k8s.io/kubernetes's go.mod has replace directives,
# and so has etcd's), so the packages they share (gRPC, protobuf, etcd's
# client, ...) compile once. etcd's version is pinned to the one
# k8s.io/kubernetes requires.
#
# Usage: hack/build-cluster.sh          (as root; see hack/lib.sh for the env)
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

GO="$(go_bin)"
# The builds must never touch the repo's module or a workspace.
export GOWORK=off GOFLAGS=-buildvcs=false

CONTROL_PLANE_MAINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

# build_control_plane builds whichever of etcd, the control plane's
# binaries and kubectl are not cached, in one go build.
build_control_plane() {
	local pkgs=() name
	for name in "${CONTROL_PLANE_MAINS[@]}"; do
		if [[ ! -x "${CONTROL_PLANE_BIN_DIR}/${name}" ]]; then
			pkgs+=("k8s.io/kubernetes/cmd/${name}")
		fi
	done
	if [[ ! -x "${ETCD_BIN}" ]]; then
		pkgs+=(go.etcd.io/etcd/server/v3)
	fi
	if ((${#pkgs[@]} == 0)); then
		log "etcd ${ETCD_VERSION}: cached at ${ETCD_BIN}"
		log "control plane ${KUBERNETES_VERSION}: cached in ${CONTROL_PLANE_BIN_DIR}"
		return
	fi
	local base="${PODRES_CACHE}/control-plane-${KUBERNETES_VERSION}"
	local src="${base}/src" out="${base}/bin.tmp"
	rm -rf "${src}" "${out}"
	mkdir -p "${src}" "${out}" "${CONTROL_PLANE_BIN_DIR}" "$(dirname "${ETCD_BIN}")"
	write_k8s_wrapper "${src}" podres-proxy.test/control-plane-build "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
	local get=() p
	for p in "${pkgs[@]}"; do
		if [[ "${p}" == k8s.io/* ]]; then get+=("${p}@${KUBERNETES_VERSION}"); else get+=("${p}@${ETCD_VERSION}"); fi
	done
	run_logged "resolve control plane ${KUBERNETES_VERSION} and etcd ${ETCD_VERSION} dependencies" \
		"${PODRES_CACHE}/logs/control-plane-${KUBERNETES_VERSION}-get.log" \
		in_dir "${src}" "${GO}" get "${get[@]}"
	# etcd's version must be the one asked for: a newer k8s.io/kubernetes
	# requiring a newer etcd would otherwise win the version selection.
	local resolved
	resolved="$(cd "${src}" && "${GO}" list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
	[[ "${resolved}" == "${ETCD_VERSION}" ]] ||
		die "k8s.io/kubernetes@${KUBERNETES_VERSION} needs etcd ${resolved}, not ETCD_VERSION=${ETCD_VERSION}"
	local v="${KUBERNETES_VERSION#v}" pkg=k8s.io/component-base/version
	local ldflags="-s -w -X ${pkg}.gitVersion=${KUBERNETES_VERSION} -X ${pkg}.gitMajor=${v%%.*}"
	ldflags+=" -X ${pkg}.gitMinor=$(cut -d. -f2 <<<"${v}") -X ${pkg}.gitTreeState=clean"
	run_logged "build $(printf '%s ' "${pkgs[@]##*/cmd/}" | sed 's#go.etcd.io/etcd/server/v3#etcd#')" \
		"${PODRES_CACHE}/logs/control-plane-${KUBERNETES_VERSION}.log" \
		in_dir "${src}" env CGO_ENABLED=0 "${GO}" build -ldflags "${ldflags}" -o "${out}/" "${pkgs[@]}"
	for name in "${CONTROL_PLANE_MAINS[@]}"; do
		if [[ -x "${out}/${name}" ]]; then
			mv "${out}/${name}" "${CONTROL_PLANE_BIN_DIR}/${name}"
		fi
	done
	# go build names the main package of go.etcd.io/etcd/server/v3 "server".
	if [[ -x "${out}/server" ]]; then
		mv "${out}/server" "${ETCD_BIN}"
	fi
	rm -rf "${out}"
	log "etcd ${ETCD_VERSION}: ${ETCD_BIN}"
	log "control plane ${KUBERNETES_VERSION}: ${CONTROL_PLANE_BIN_DIR}"
}

main() {
	local start
	start="$(date +%s)"
	mkdir -p "${PODRES_CACHE}/logs"
	"${PODRES_REPO}/hack/build-node.sh"
	build_control_plane
	"${PODRES_REPO}/hack/build-dradriver.sh" >/dev/null
	log "all cluster artifacts ready in $(($(date +%s) - start))s"
}

main "$@"

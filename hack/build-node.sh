#!/usr/bin/env bash
# build-node.sh installs and builds everything a test node needs, caching each
# artifact under PODRES_CACHE keyed by version, so a second run takes seconds:
#
#   - Debian packages: runc, the CNI plugins (in /usr/lib/cni), iptables,
#     iproute2, jq (installed only when missing);
#   - containerd, containerd-shim-runc-v2 and ctr, built with `go install` from
#     the Go module proxy into PODRES_CACHE/containerd-VERSION/bin;
#   - the kubelet, built from k8s.io/kubernetes through a generated wrapper
#     module (outside the repo's module) into PODRES_CACHE/kubelet-VERSION/bin;
#   - the pause image: hack/pause packed by hack/ociimage as an OCI image layout tarball under
#     the name containerd pins for sandboxes, in PODRES_CACHE/pause-*/.
#
# Usage: hack/build-node.sh            (as root; see hack/lib.sh for the env)
#        PODRES_SKIP_PACKAGES=1 ...    skips the Debian packages step
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

GO="$(go_bin)"
# The builds must never touch the repo's module or a workspace.
export GOWORK=off GOFLAGS=-buildvcs=false
# install_packages installs the Debian packages the node needs, if missing.
install_packages() {
	if [[ -n "${PODRES_SKIP_PACKAGES:-}" ]]; then
		log "packages: skipped (PODRES_SKIP_PACKAGES)"
		return
	fi
	local wanted=(runc containernetworking-plugins iptables iproute2 jq) missing=() p
	for p in "${wanted[@]}"; do
		if ! dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q '^install ok installed$'; then
			missing+=("${p}")
		fi
	done
	if ((${#missing[@]} == 0)); then
		log "packages: ${wanted[*]} already installed"
		return
	fi
	require_root
	export DEBIAN_FRONTEND=noninteractive
	run_logged "apt-get update" "${PODRES_CACHE}/logs/apt-update.log" apt-get update
	run_logged "apt-get install ${missing[*]}" "${PODRES_CACHE}/logs/apt-install.log" \
		apt-get install -y --no-install-recommends "${missing[@]}"
}

# build_containerd builds containerd, its runc shim and ctr at
# CONTAINERD_VERSION into CONTAINERD_BIN_DIR.
build_containerd() {
	local bins=(containerd containerd-shim-runc-v2 ctr) b have=1
	for b in "${bins[@]}"; do
		[[ -x "${CONTAINERD_BIN_DIR}/${b}" ]] || have=0
	done
	if ((have)); then
		log "containerd ${CONTAINERD_VERSION}: cached in ${CONTAINERD_BIN_DIR}"
		return
	fi
	local tmp="${CONTAINERD_BIN_DIR}.tmp" mod=github.com/containerd/containerd/v2
	if [[ "$(version_part "${CONTAINERD_VERSION}" 1)" == 1 ]]; then
		mod=github.com/containerd/containerd
	fi
	rm -rf "${tmp}"
	mkdir -p "${tmp}"
	# Static binaries (no cgo): the btrfs snapshotter, the only cgo user,
	# is not needed; the node uses the native snapshotter.
	local ldflags="-s -w -X ${mod}/version.Version=${CONTAINERD_VERSION}"
	if [[ "$(version_part "${CONTAINERD_VERSION}" 1)" == 1 ]]; then
		# 1.7's go.mod has an exclude directive, which `go install pkg@version`
		# refuses: build in the downloaded module, as its own main module.
		local dir
		dir="$(GOFLAGS=-mod=mod "${GO}" mod download -json "${mod}@${CONTAINERD_VERSION}" | jq -r .Dir)"
		[[ -d "${dir}" ]] || die "could not download ${mod}@${CONTAINERD_VERSION}"
		run_logged "build containerd ${CONTAINERD_VERSION} (containerd, shim, ctr)" \
			"${PODRES_CACHE}/logs/containerd-${CONTAINERD_VERSION}.log" \
			in_dir "${dir}" env CGO_ENABLED=0 "${GO}" build -ldflags "${ldflags}" -o "${tmp}/" \
			./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr
	else
		run_logged "build containerd ${CONTAINERD_VERSION} (containerd, shim, ctr)" \
			"${PODRES_CACHE}/logs/containerd-${CONTAINERD_VERSION}.log" \
			env GOBIN="${tmp}" CGO_ENABLED=0 "${GO}" install -ldflags "${ldflags}" \
			"${mod}/cmd/containerd@${CONTAINERD_VERSION}" \
			"${mod}/cmd/containerd-shim-runc-v2@${CONTAINERD_VERSION}" \
			"${mod}/cmd/ctr@${CONTAINERD_VERSION}"
	fi
	rm -rf "${CONTAINERD_BIN_DIR}"
	mv "${tmp}" "${CONTAINERD_BIN_DIR}"
	log "containerd ${CONTAINERD_VERSION}: built into ${CONTAINERD_BIN_DIR}"
}

# build_kubelet builds the kubelet at KUBERNETES_VERSION into KUBELET_BIN.
build_kubelet() {
	if [[ -x "${KUBELET_BIN}" ]]; then
		log "kubelet ${KUBERNETES_VERSION}: cached at ${KUBELET_BIN}"
		return
	fi
	local base src
	base="$(dirname "$(dirname "${KUBELET_BIN}")")"
	src="${base}/src"
	rm -rf "${src}"
	mkdir -p "${src}" "$(dirname "${KUBELET_BIN}")"
	write_k8s_wrapper "${src}" podres-proxy.test/kubelet-build
	run_logged "resolve kubelet ${KUBERNETES_VERSION} dependencies" \
		"${PODRES_CACHE}/logs/kubelet-${KUBERNETES_VERSION}-get.log" \
		in_dir "${src}" "${GO}" get "k8s.io/kubernetes/cmd/kubelet@${KUBERNETES_VERSION}"
	local v="${KUBERNETES_VERSION#v}" pkg=k8s.io/component-base/version
	local ldflags="-s -w -X ${pkg}.gitVersion=${KUBERNETES_VERSION} -X ${pkg}.gitMajor=${v%%.*}"
	ldflags+=" -X ${pkg}.gitMinor=$(cut -d. -f2 <<<"${v}") -X ${pkg}.gitTreeState=clean"
	run_logged "build kubelet ${KUBERNETES_VERSION}" \
		"${PODRES_CACHE}/logs/kubelet-${KUBERNETES_VERSION}.log" \
		in_dir "${src}" env CGO_ENABLED=0 "${GO}" build -ldflags "${ldflags}" \
		-o "${KUBELET_BIN}.tmp" k8s.io/kubernetes/cmd/kubelet
	mv "${KUBELET_BIN}.tmp" "${KUBELET_BIN}"
	log "kubelet ${KUBERNETES_VERSION}: built at ${KUBELET_BIN}"
}

# sandbox_image_name prints the sandbox image containerd pins by default
# (`sandbox` in 2.x's configuration, `sandbox_image` in 1.7's).
sandbox_image_name() {
	local name
	name="$("${CONTAINERD_BIN_DIR}/containerd" config default |
		sed -n -E "s/^[[:space:]]*sandbox(_image)?[[:space:]]*=[[:space:]]*['\"]([^'\"]+)['\"].*$/\2/p" | head -n 1)"
	[[ -n "${name}" ]] || die "could not find the pinned sandbox image in 'containerd config default'"
	echo "${name}"
}

# build_pause builds hack/pause and packs it with hack/ociimage as an OCI
# image layout tarball named after containerd's pinned sandbox image.
build_pause() {
	local dir
	dir="$(pause_cache_dir)"
	if [[ -f "${dir}/pause.tar" && -f "${dir}/image-name" ]]; then
		log "pause image $(cat "${dir}/image-name"): cached in ${dir}"
		return
	fi
	local name arch work
	name="$(sandbox_image_name)"
	arch="$("${GO}" env GOARCH)"
	work="$(mktemp -d)"
	mkdir -p "${work}/rootfs"
	log "pause image ${name}: building hack/pause (${arch})"
	(cd "${PODRES_REPO}" && CGO_ENABLED=0 "${GO}" build -trimpath -ldflags '-s -w' \
		-o "${work}/rootfs/pause" ./hack/pause)

	# One layer holding /pause, as an OCI layout tarball named so that
	# `ctr images import` registers it under the pinned name.
	mkdir -p "${dir}"
	(cd "${PODRES_REPO}" && "${GO}" run ./hack/ociimage --binary "${work}/rootfs/pause" --name "${name}" \
		--path /pause --entrypoint /pause --cmd "" --arch "${arch}" -o "${dir}/pause.tar")
	echo "${name}" >"${dir}/image-name"
	rm -rf "${work}"
	log "pause image ${name}: packed into ${dir}/pause.tar"
}

main() {
	local start
	start="$(date +%s)"
	mkdir -p "${PODRES_CACHE}/logs"
	log "cache: ${PODRES_CACHE}"
	install_packages
	build_containerd
	build_pause
	build_kubelet
	log "all node artifacts ready in $(($(date +%s) - start))s"
}

main "$@"

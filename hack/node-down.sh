#!/usr/bin/env bash
# node-down.sh stops the test node that hack/node-up.sh started under ROOT and
# removes what it left on the host. Safe to run again, or on a node that never
# came up.
#
# Usage: hack/node-down.sh ROOT        (as root)
#        PODRES_NODE_PURGE=1 hack/node-down.sh ROOT   also removes ROOT
#
# Order: the kubelet first (so it restarts nothing), then containerd, then
# the processes of the node's containers and their containerd-shim-runc-v2,
# each ended by its own PID: a process belongs to the node when its command
# line names ROOT or its root directory lies under ROOT (container processes
# such as pause run in a rootfs under ROOT). Then it unmounts everything
# under ROOT (rootfs, shm, network namespaces), deletes the node's bridge and
# CNI cache entries, and the device manager's files the kubelet wrote to
# /var/lib/kubelet/device-plugins when that directory was the node's own.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -eq 1 && "$1" != -* ]] || {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
}
require_root
if [[ ! -d "$1" ]]; then
	log "${1}: no such directory, nothing to stop"
	exit 0
fi
ROOT="$(cd "$1" && pwd)"
[[ "${ROOT}" != / ]] || die "refusing to treat / as a node root"
PIDS="${ROOT}/pids"
LOGS="${ROOT}/logs"

# ancestors prints this script's PID and those of all its ancestors: their
# command lines may name ROOT too (node-up.sh, a shell running both).
ancestors() {
	local pid="${BASHPID}"
	while [[ -n "${pid}" && "${pid}" != 0 ]]; do
		echo "${pid}"
		pid="$(awk '{ sub(/^.*\) /, ""); print $2 }' "/proc/${pid}/stat" 2>/dev/null)"
	done
}

# container_ids prints the ids of the node's sandboxes and containers: the
# bundle directories in containerd's state dir.
container_ids() {
	local dir
	for dir in "${ROOT}/containerd/state/io.containerd.runtime.v2.task"/*/*; do
		if [[ -d "${dir}" ]]; then
			basename "${dir}"
		fi
	done
}

# node_pids prints the PIDs of all processes that belong to the node (see
# pid_belongs: containerd, the kubelet, the shims, the containers'
# processes), except this script and its ancestors.
node_pids() {
	local dir pid skip
	skip=" $(ancestors | tr '\n' ' ') $$ "
	for dir in /proc/[0-9]*; do
		pid="${dir#/proc/}"
		[[ "${skip}" == *" ${pid} "* ]] && continue
		pid_alive "${pid}" || continue
		if pid_belongs "${pid}"; then
			echo "${pid}"
		fi
	done
}

# comm PID prints the process's name.
comm() {
	cat "/proc/$1/comm" 2>/dev/null || echo "?"
}

stop_processes() {
	local pid name
	# Container processes are recognised by their cgroup (see pid_belongs).
	NODE_CONTAINER_IDS="$(container_ids | tr '\n' ' ')"
	for pid in $(recorded_pids kubelet); do stop_pid kubelet "${pid}" 15; done
	for pid in $(recorded_pids containerd); do stop_pid containerd "${pid}" 15; done
	# Anything else recorded (tests may record their own processes).
	while read -r name pid; do
		[[ -n "${pid:-}" ]] || continue
		stop_pid "${name}" "${pid}" 10
	done < <(awk '$1 != "kubelet" && $1 != "containerd"' "${PIDS}" 2>/dev/null || true)
	# Container processes first, then the shims.
	local shims=()
	for pid in $(node_pids); do
		if [[ "$(comm "${pid}")" == containerd-shim* ]]; then
			shims+=("${pid}")
		else
			stop_pid "$(comm "${pid}")" "${pid}" 5
		fi
	done
	for pid in "${shims[@]}"; do stop_pid containerd-shim-runc-v2 "${pid}" 5; done
	# Last pass: whatever is left (e.g. a process started meanwhile).
	for pid in $(node_pids); do stop_pid "$(comm "${pid}")" "${pid}" 2; done
	rm -f "${PIDS}"
}

# clean_network removes the node's bridge and CNI cache entries.
clean_network() {
	local bridge="" network=""
	if [[ -f "${ROOT}/node.env" ]]; then
		bridge="$(sed -n 's/^CNI_BRIDGE=//p' "${ROOT}/node.env")"
		network="$(sed -n 's/^CNI_NETWORK=//p' "${ROOT}/node.env")"
	fi
	if [[ -n "${bridge}" ]] && ip link show "${bridge}" >/dev/null 2>&1; then
		ip link delete "${bridge}"
		log "deleted bridge ${bridge}"
	fi
	if [[ -d /var/lib/cni/results ]]; then
		if [[ -n "${network}" ]]; then
			find /var/lib/cni/results -maxdepth 1 -name "${network}-*" -delete
		fi
		# containerd's own loopback network, per sandbox.
		local id
		for id in $(container_ids); do
			rm -f "/var/lib/cni/results/cni-loopback-${id}-lo"
		done
	fi
}

# clean_shim_sockets removes the sockets of the node's shims: containerd
# keeps them in /run/containerd/s whatever its state dir, named by the
# sha256 of "<containerd address>/<namespace>/<sandbox id>" (pkg/shim), and
# a killed shim leaves its socket behind.
clean_shim_sockets() {
	local sock tasks dir ns id hash n=0
	[[ -f "${ROOT}/node.env" && -d /run/containerd/s ]] || return 0
	sock="$(sed -n 's/^CONTAINERD_SOCK=//p' "${ROOT}/node.env")"
	tasks="${ROOT}/containerd/state/io.containerd.runtime.v2.task"
	[[ -n "${sock}" && -d "${tasks}" ]] || return 0
	for dir in "${tasks}"/*/*; do
		[[ -d "${dir}" ]] || continue
		id="$(basename "${dir}")"
		ns="$(basename "$(dirname "${dir}")")"
		for suffix in "" /debug; do
			hash="$(printf '%s' "${sock}/${ns}/${id}${suffix}" | sha256sum | cut -d' ' -f1)"
			if [[ -S "/run/containerd/s/${hash}" ]]; then
				rm -f "/run/containerd/s/${hash}"
				n=$((n + 1))
			fi
		done
	done
	if ((n > 0)); then
		log "removed ${n} shim socket(s) from /run/containerd/s"
	fi
}

# clean_host_device_plugin_dir removes what the kubelet wrote to the device
# manager's fixed directory, when the node created that directory.
clean_host_device_plugin_dir() {
	local dir=/var/lib/kubelet/device-plugins
	[[ -f "${ROOT}/node.env" ]] || return 0
	grep -q '^HOST_DEVICE_PLUGIN_DIR_CREATED=1$' "${ROOT}/node.env" || return 0
	# Another node's kubelet (or a real one) may be using it now.
	local pid
	for pid in $(pgrep -x kubelet || true); do
		pid_alive "${pid}" || continue
		log "leaving ${dir} in place: kubelet pid ${pid} is running"
		return 0
	done
	if [[ -d "${dir}" ]]; then
		rm -rf "${dir}"
		rmdir /var/lib/kubelet 2>/dev/null || true
		log "removed ${dir} (the kubelet's device manager ignores --root-dir)"
	fi
}

main() {
	log "stopping the node under ${ROOT}"
	stop_processes
	clean_shim_sockets
	unmount_under "${ROOT}"
	clean_network
	clean_host_device_plugin_dir
	if [[ -n "${PODRES_NODE_PURGE:-}" ]]; then
		rm -rf "${ROOT}"
		log "removed ${ROOT}"
	fi
	log "node under ${ROOT} is down"
}

main "$@"

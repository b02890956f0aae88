#!/usr/bin/env bash
# cluster-down.sh stops the cluster hack/cluster-up.sh started and removes
# what it left on the host: its processes (control plane, kubelet,
# containerd, the containers and their shims), the mounts under ROOT and
# under the kubelet's root, the shared bind mount of /run/containerd, the
# bridge, the iptables chain PODRES-CLUSTER, and the host directories
# cluster-up.sh created (listed in ROOT/created). Safe to run again, or on a
# cluster that never came up. It ends by checking that nothing is left and
# fails if something is.
#
# Usage: hack/cluster-down.sh (as root)
#        PODRES_CLUSTER_PURGE=1 ...   also removes ROOT (logs included)
# Settings: PODRES_CLUSTER_ROOT as for cluster-up.sh.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -eq 0 ]] || {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
}
require_root
ROOT="${PODRES_CLUSTER_ROOT:-/var/tmp/podres-cluster}"
if [[ ! -d "${ROOT}" ]]; then
	log "${ROOT}: no such directory, nothing to stop"
	exit 0
fi
ROOT="$(cd "${ROOT}" && pwd)"
[[ "${ROOT}" != / ]] || die "refusing to treat / as the cluster's root"
PIDS="${ROOT}/pids"
CONTAINERD_SOCK=""
KUBELET_ROOT=""
CNI_BRIDGE=""
if [[ -f "${ROOT}/cluster.env" ]]; then
	# shellcheck source=/dev/null
	source "${ROOT}/cluster.env"
fi

# shim_pids prints the PIDs of the containerd shims this cluster's
# containerd started: they name its socket on their command line.
shim_pids() {
	[[ -n "${CONTAINERD_SOCK}" ]] || return 0
	local dir pid cmdline
	for dir in /proc/[0-9]*; do
		pid="${dir#/proc/}"
		[[ "$(cat "${dir}/comm" 2>/dev/null)" == containerd-shim* ]] || continue
		cmdline="$({ tr '\0' ' ' <"${dir}/cmdline"; } 2>/dev/null)" || continue
		if [[ " ${cmdline} " == *" -address ${CONTAINERD_SOCK} "* ]]; then
			echo "${pid}"
		fi
	done
}

remove_iptables_chain() {
	local table_rules
	table_rules="$(iptables -t nat -S 2>/dev/null)" || return 0
	grep -q -- '-N PODRES-CLUSTER$' <<<"${table_rules}" || return 0
	local hook
	for hook in PREROUTING OUTPUT; do
		while iptables -t nat -D "${hook}" -j PODRES-CLUSTER 2>/dev/null; do :; done
	done
	iptables -t nat -F PODRES-CLUSTER
	iptables -t nat -X PODRES-CLUSTER
	log "removed the iptables chain PODRES-CLUSTER (nat)"
}

# remove_created removes the host directories cluster-up.sh created, deepest
# first. /run/containerd keeps what other containerds put there (shim
# sockets), /var/lib/kubelet its device-plugins directory while another
# kubelet runs.
remove_created() {
	[[ -f "${ROOT}/created" ]] || return 0
	local d
	if [[ -n "${CONTAINERD_SOCK}" ]]; then
		rm -f "${CONTAINERD_SOCK}" "${CONTAINERD_SOCK}.ttrpc"
	fi
	while read -r d; do
		[[ -n "${d}" && -d "${d}" ]] || continue
		case "${d}" in
		/run/containerd)
			rmdir "${d}/s" 2>/dev/null || true
			rmdir "${d}" 2>/dev/null || log "leaving ${d}: it holds other containerds' files"
			;;
		/var/lib/kubelet)
			if pgrep -x kubelet >/dev/null; then
				find "${d}" -mindepth 1 -maxdepth 1 ! -name device-plugins -exec rm -rf {} +
				log "leaving ${d}/device-plugins: another kubelet runs"
			else
				rm -rf "${d}"
			fi
			;;
		*) rm -rf "${d}" ;;
		esac
		log "removed ${d} (cluster-up.sh created it)"
	done < <(sort -r "${ROOT}/created")
	rm -f "${ROOT}/created"
	# The kubelet's root existed before cluster-up.sh (another kubelet's
	# device manager made it): remove what this cluster's kubelet added.
	local before="${ROOT}/kubelet-root-before" e
	if [[ -f "${before}" && -n "${KUBELET_ROOT}" && -d "${KUBELET_ROOT}" ]]; then
		while read -r e; do
			[[ "${e}" == device-plugins ]] && continue
			if ! grep -qxF -- "${e}" "${before}"; then
				rm -rf "${KUBELET_ROOT:?}/${e}"
			fi
		done < <(ls -A "${KUBELET_ROOT}")
		rm -f "${before}"
		log "removed what this cluster's kubelet wrote in ${KUBELET_ROOT} (the directory was there before)"
	fi
}

# leftovers prints what of the cluster is still on the host.
leftovers() {
	local pid
	for pid in $(shim_pids); do echo "process ${pid} ($(cat "/proc/${pid}/comm" 2>/dev/null))"; done
	local dir cmdline
	for dir in /proc/[0-9]*; do
		cmdline="$({ tr '\0' ' ' <"${dir}/cmdline"; } 2>/dev/null)" || continue
		if [[ "${cmdline}" == *"${ROOT}/"* && "${dir#/proc/}" != "$$" && "${dir#/proc/}" != "${BASHPID}" ]]; then
			pid_alive "${dir#/proc/}" && echo "process ${dir#/proc/}: ${cmdline}"
		fi
	done
	awk -v r="${ROOT}" -v k="${KUBELET_ROOT:-/nonexistent}" \
		'index($5, r "/") == 1 || $5 == k || index($5, k "/") == 1 { print "mount " $5 }' /proc/self/mountinfo
	local m
	while read -r m; do
		if [[ -n "${m}" ]] && awk -v m="${m}" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; then
			echo "mount ${m}"
		fi
	done < <(cat "${ROOT}/bind-mounts" 2>/dev/null)
	if [[ -n "${CNI_BRIDGE}" ]] && ip link show "${CNI_BRIDGE}" >/dev/null 2>&1; then echo "bridge ${CNI_BRIDGE}"; fi
	if iptables -t nat -S 2>/dev/null | grep -q PODRES-CLUSTER; then echo "iptables chain PODRES-CLUSTER"; fi
	return 0
}

main() {
	log "stopping the cluster under ${ROOT}"
	if [[ -f "${ROOT}/node.env" || -s "${PIDS}" ]]; then
		# The node's part and every recorded process (the control plane too).
		"${PODRES_REPO}/hack/node-down.sh" "${ROOT}"
	fi
	local pid
	for pid in $(shim_pids); do
		stop_pid_unchecked containerd-shim-runc-v2 "${pid}"
	done
	if [[ -n "${KUBELET_ROOT}" ]]; then
		unmount_under "${KUBELET_ROOT}"
	fi
	if [[ -f "${ROOT}/bind-mounts" ]]; then
		local m
		while read -r m; do
			[[ -n "${m}" ]] && unmount_under "${m}"
		done <"${ROOT}/bind-mounts"
	fi
	remove_iptables_chain
	remove_created
	rm -f "${ROOT}/node.env" "${ROOT}/cluster.env"
	local left
	left="$(leftovers)"
	if [[ -n "${left}" ]]; then
		log "WARNING: left behind:"
		printf '  %s\n' "${left}" >&2
		exit 1
	fi
	rm -f "${ROOT}/bind-mounts"
	if [[ -n "${PODRES_CLUSTER_PURGE:-}" ]]; then
		rm -rf "${ROOT}"
		log "removed ${ROOT}"
	fi
	log "cluster under ${ROOT} is down; nothing of it is left"
}

# stop_pid_unchecked NAME PID: SIGTERM, then SIGKILL after 5 s. The shims'
# command lines do not name ROOT, so lib.sh's stop_pid would not stop them.
stop_pid_unchecked() {
	local i
	log "stopping $1 (pid $2)"
	kill -TERM "$2" 2>/dev/null || return 0
	for ((i = 0; i < 50; i++)); do
		pid_alive "$2" || return 0
		sleep 0.1
	done
	kill -KILL "$2" 2>/dev/null || true
}

main "$@"

#!/usr/bin/env bash
# node-restart.sh restarts one component of the test node under ROOT, as an
# operator or a crash would: it ends the running process by its PID (SIGTERM,
# SIGKILL after 15 s), starts it again with the same settings, and waits
# until it answers again. Containers keep running: containerd's shims
# outlive containerd, and the kubelet finds its pods again.
#
# Usage: hack/node-restart.sh ROOT kubelet|containerd    (as root)
#        PODRES_RESTART_SIGNAL=KILL ...   ends the process with SIGKILL
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ $# -ne 2 || ! "$2" =~ ^(kubelet|containerd)$ ]]; then
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
fi
require_root
ROOT="$(cd "$1" && pwd)"
COMPONENT="$2"
PIDS="${ROOT}/pids"
LOGS="${ROOT}/logs"
load_node_env
[[ -x "${ROOT}/bin/${COMPONENT}" ]] || die "${ROOT}/bin/${COMPONENT} is missing: start the node with hack/node-up.sh"

main() {
	local start_time pid
	start_time="$(date +%s)"
	for pid in $(recorded_pids "${COMPONENT}"); do
		if [[ "${PODRES_RESTART_SIGNAL:-TERM}" == KILL ]] && pid_alive "${pid}" && pid_belongs "${pid}"; then
			log "killing ${COMPONENT} (pid ${pid})"
			kill -KILL "${pid}"
		fi
		stop_pid "${COMPONENT}" "${pid}" 15
	done
	forget_pids "${COMPONENT}"
	log "${COMPONENT} stopped; starting it again"
	start_component "${COMPONENT}"
	case "${COMPONENT}" in
	containerd) await_containerd ;;
	kubelet) await_kubelet ;;
	esac
	log "${COMPONENT} restarted in $(($(date +%s) - start_time))s"
}

main "$@"

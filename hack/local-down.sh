#!/usr/bin/env bash
# local-down.sh stops what hack/local-up.sh started (podres-proxy, the
# kubelet, containerd and the demo pods' processes, each by its own PID),
# cleans up the node's mounts and network, and removes its directory.
#
# Usage: hack/local-down.sh (as root)     (PODRES_LOCAL_ROOT as for local-up.sh)
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root

ROOT="${PODRES_LOCAL_ROOT:-/var/tmp/podres-local}"
if [[ ! -d "${ROOT}" ]]; then
	log "nothing to stop: ${ROOT} does not exist"
	exit 0
fi
# node-down.sh stops every process recorded in ROOT/pids, podres-proxy too.
PODRES_NODE_PURGE=1 "${PODRES_REPO}/hack/node-down.sh" "${ROOT}"
log "stopped; ${ROOT} removed"

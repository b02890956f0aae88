# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables are used by the scripts that source this file
# Shared settings and helpers of the test-node and cluster scripts (build-*.sh,
# node-up.sh, node-down.sh, cluster-up.sh, cluster-down.sh, ...). Source it;
# it defines no behaviour of its own.
#
# Versions and paths (each can be overridden from the environment):
#   PODRES_CACHE          cache of built artifacts (default <repo>/_output/cache)
#   CONTAINERD_VERSION    containerd, its runc shim and ctr (default v2.4.2;
#                         1.7.x works too, with NRI enabled in its config)
#   KUBERNETES_VERSION    the kubelet, and the control plane and kubectl of
#                         hack/build-cluster.sh (default v1.37.2)
#   ETCD_VERSION          etcd for hack/cluster-up.sh (default v3.7.0, the
#                         version KUBERNETES_VERSION's go.mod requires)

PODRES_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PODRES_CACHE="${PODRES_CACHE:-${PODRES_REPO}/_output/cache}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.0}"

CONTAINERD_BIN_DIR="${PODRES_CACHE}/containerd-${CONTAINERD_VERSION}/bin"
KUBELET_BIN="${PODRES_CACHE}/kubelet-${KUBERNETES_VERSION}/bin/kubelet"
# hack/build-cluster.sh: etcd, and the control plane with kubectl.
ETCD_BIN="${PODRES_CACHE}/etcd-${ETCD_VERSION}/bin/etcd"
CONTROL_PLANE_BIN_DIR="${PODRES_CACHE}/control-plane-${KUBERNETES_VERSION}/bin"
# The pause image's cache entry is keyed by containerd's version (which
# decides the image name) and by a hash of the pause program's source.
PAUSE_DIR_PREFIX="${PODRES_CACHE}/pause-${CONTAINERD_VERSION}"

# Debian puts the CNI plugins here.
CNI_SYSTEM_BIN_DIR="${CNI_SYSTEM_BIN_DIR:-/usr/lib/cni}"

# version_part prints part N (1: major, 2: minor) of a version such as v1.37.2.
version_part() {
	local v="${1#v}"
	cut -d. -f"$2" <<<"${v}"
}

# pods_api_gate prints the KubeletConfiguration lines that make the kubelet at
# KUBERNETES_VERSION serve its Pods API (KEP-4188) when $1 is 1, or not when 0,
# and nothing where that is the version's default, so the gate stays as users
# have it: beta and on by default from 1.37, alpha and off in 1.36, absent
# before (a kubelet refuses a gate it does not know).
pods_api_gate() {
	local minor
	minor="$(version_part "${KUBERNETES_VERSION}" 2)"
	if ((minor >= 37)); then
		[[ "$1" == 1 ]] || printf 'featureGates:\n  PodsAPI: false\n'
	elif ((minor == 36)); then
		[[ "$1" == 0 ]] || printf 'featureGates:\n  PodsAPI: true\n'
	elif [[ "$1" == 1 ]]; then
		die "kubelet ${KUBERNETES_VERSION} has no Pods API (alpha from 1.36): PODRES_KUBELET_PODS_API=0"
	fi
}

# log prints a progress line on stderr, prefixed with the script's name.
log() {
	printf '%s [%s] %s\n' "$(date +%H:%M:%S)" "$(basename "$0" .sh)" "$*" >&2
}

# die prints an error and exits non-zero.
die() {
	log "ERROR: $*"
	exit 1
}

# require_root exits unless the script runs as root.
require_root() {
	if [[ "$(id -u)" != 0 ]]; then
		die "must run as root (it installs packages, mounts and starts a container runtime)"
	fi
}

# go_bin prints the go binary to use: the one on PATH, else /usr/local/go/bin/go.
go_bin() {
	if command -v go >/dev/null 2>&1; then
		command -v go
	elif [[ -x /usr/local/go/bin/go ]]; then
		echo /usr/local/go/bin/go
	else
		die "no go toolchain found (PATH or /usr/local/go/bin)"
	fi
}

# ---------------------------------------------------------------------------
# Builds (hack/build-node.sh, hack/build-cluster.sh). These need GO set to
# the go binary (go_bin).

# Heartbeat interval of long builds, in seconds.
HEARTBEAT="${PODRES_BUILD_HEARTBEAT:-30}"

# run_logged runs a long command with its output in LOGFILE, printing a line
# every HEARTBEAT seconds while it runs and the log's tail if it fails.
# Usage: run_logged WHAT LOGFILE cmd args...
run_logged() {
	local what="$1" logfile="$2"
	shift 2
	local start pid rc=0
	start="$(date +%s)"
	log "${what}: started (log: ${logfile})"
	"$@" >"${logfile}" 2>&1 &
	pid=$!
	while kill -0 "${pid}" 2>/dev/null; do
		local waited=0
		while ((waited < HEARTBEAT)) && kill -0 "${pid}" 2>/dev/null; do
			sleep 1
			waited=$((waited + 1))
		done
		if kill -0 "${pid}" 2>/dev/null; then
			log "${what}: still running ($(($(date +%s) - start))s)"
		fi
	done
	wait "${pid}" || rc=$?
	if ((rc != 0)); then
		tail -n 40 "${logfile}" >&2 || true
		die "${what} failed (exit ${rc}); full log: ${logfile}"
	fi
	log "${what}: done in $(($(date +%s) - start))s"
}

# in_dir runs a command in a directory. Usage: in_dir DIR cmd args...
in_dir() {
	cd "$1" || return
	shift
	"$@"
}

# write_k8s_wrapper DIR MODULE writes, in DIR, a Go module named MODULE that
# requires k8s.io/kubernetes at KUBERNETES_VERSION and replaces each staging
# module that the published go.mod points at ./staging with the published
# v0.X.Y of that module: the published go.mod cannot be built from outside
# (go install refuses replace directives), a wrapper module can. The go.mod
# is written by go mod init and go mod edit, from k8s.io/kubernetes's go.mod
# as go mod edit -json reads it. Extra REQUIREMENTS (module@version) may
# follow MODULE.
write_k8s_wrapper() {
	local dir="$1" module="$2"
	shift 2
	local gomod staging_version replaces m
	gomod="$(cd "${dir}" && "${GO}" mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | jq -r .GoMod)"
	[[ -f "${gomod}" ]] || die "could not download k8s.io/kubernetes@${KUBERNETES_VERSION}'s go.mod"
	# v1.36.3 -> v0.36.3: the staging modules are published with major 0.
	staging_version="v0.${KUBERNETES_VERSION#v*.}"
	replaces="$("${GO}" mod edit -json "${gomod}" |
		jq -r '.Replace[]? | select(.New.Path | startswith("./staging/")) | .Old.Path' | sort -u)"
	[[ -n "${replaces}" ]] || die "no ./staging replace directives found in ${gomod}"
	local edits=("-go=$("${GO}" mod edit -json "${gomod}" | jq -r .Go)" "-require=k8s.io/kubernetes@${KUBERNETES_VERSION}")
	for m in "$@"; do
		edits+=("-require=${m}")
	done
	while read -r m; do
		edits+=("-replace=${m}=${m}@${staging_version}")
	done <<<"${replaces}"
	rm -f "${dir}/go.mod" "${dir}/go.sum"
	(cd "${dir}" && "${GO}" mod init "${module}" >/dev/null 2>&1 && "${GO}" mod edit "${edits[@]}") ||
		die "could not write the wrapper module ${module} in ${dir}"
	log "${module}: $(wc -l <<<"${replaces}") staging modules replaced with ${staging_version}"
}

# pause_source_hash prints a short hash of the pause program's source and the
# packing code (containerd's version is in the directory name): the pause
# cache key.
pause_source_hash() {
	cat "${PODRES_REPO}/hack/pause/"*.go "${PODRES_REPO}/hack/ociimage/"*.go "${PODRES_REPO}/hack/build-node.sh" |
		sha256sum | cut -c1-12
}

# pause_cache_dir prints the directory holding the pause image tarball.
pause_cache_dir() {
	echo "${PAUSE_DIR_PREFIX}-$(pause_source_hash)"
}

# wait_until runs "$@" every 0.2 s until it succeeds or TIMEOUT seconds pass,
# printing a progress line every 5 s. Usage: wait_until TIMEOUT WHAT cmd args...
wait_until() {
	local timeout="$1" what="$2"
	shift 2
	local start now last
	start="$(date +%s)"
	last="${start}"
	until "$@" >/dev/null 2>&1; do
		now="$(date +%s)"
		if ((now - start >= timeout)); then
			log "timed out after ${timeout}s waiting for ${what}"
			return 1
		fi
		if ((now - last >= 5)); then
			log "still waiting for ${what} ($((now - start))s)"
			last="${now}"
		fi
		sleep 0.2
	done
	log "${what}: ready after $(($(date +%s) - start))s"
}

# ---------------------------------------------------------------------------
# Node processes. These need ROOT, LOGS and PIDS (ROOT/pids) set; the
# readiness checks also need the settings of ROOT/node.env (load_node_env).

# load_node_env reads ROOT/node.env, which node-up.sh wrote.
load_node_env() {
	[[ -f "${ROOT}/node.env" ]] || die "${ROOT}/node.env is missing: was the node started by hack/node-up.sh?"
	# shellcheck source=/dev/null
	source "${ROOT}/node.env"
}

# pid_alive PID fails when the process has exited (a zombie counts as exited).
pid_alive() {
	[[ -e "/proc/$1" ]] && ! grep -q '^[^)]*) Z' "/proc/$1/stat" 2>/dev/null
}

# pid_belongs PID succeeds when the process belongs to the node under ROOT:
# its command line names ROOT, or (when NODE_CONTAINER_IDS lists the node's
# container ids) its cgroup path names one of the node's containers.
pid_belongs() {
	local pid="$1" cmdline cg id
	cmdline="$(tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null)" || return 1
	[[ "${cmdline}" == *"${ROOT}/"* || "${cmdline}" == *"${ROOT} "* ]] && return 0
	[[ -n "${NODE_CONTAINER_IDS:-}" ]] || return 1
	cg="$(cat "/proc/${pid}/cgroup" 2>/dev/null)" || return 1
	for id in ${NODE_CONTAINER_IDS}; do
		[[ "${cg}" == *"/${id}"* ]] && return 0
	done
	return 1
}

# stop_pid NAME PID [TIMEOUT] sends SIGTERM, waits up to TIMEOUT seconds
# (default 10), then sends SIGKILL. It leaves alone a PID that no longer
# belongs to the node (exited, or reused by another process).
stop_pid() {
	local name="$1" pid="$2" timeout="${3:-10}" i
	if ! pid_alive "${pid}" || ! pid_belongs "${pid}"; then
		return 0
	fi
	log "stopping ${name} (pid ${pid})"
	kill -TERM "${pid}" 2>/dev/null || return 0
	for ((i = 0; i < timeout * 10; i++)); do
		pid_alive "${pid}" || return 0
		sleep 0.1
	done
	log "${name} (pid ${pid}) ignored SIGTERM for ${timeout}s: SIGKILL"
	kill -KILL "${pid}" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		pid_alive "${pid}" || return 0
		sleep 0.1
	done
	log "WARNING: ${name} (pid ${pid}) is still there"
}

# recorded_pids NAME prints the PIDs recorded for NAME in ROOT/pids.
recorded_pids() {
	[[ -f "${PIDS}" ]] || return 0
	awk -v n="$1" '$1 == n { print $2 }' "${PIDS}"
}

# forget_pids NAME removes NAME's lines from ROOT/pids.
forget_pids() {
	[[ -f "${PIDS}" ]] || return 0
	awk -v n="$1" '$1 != n' "${PIDS}" >"${PIDS}.tmp"
	mv "${PIDS}.tmp" "${PIDS}"
}

# start_component NAME runs ROOT/bin/NAME (a script that execs the
# component) in its own session, with no terminal and its output appended
# to LOGS/NAME.log, and records its PID.
start_component() {
	local name="$1"
	# fd 3 is closed: a caller reading our output through a pipe must not wait
	# for the component.
	setsid "${ROOT}/bin/${name}" </dev/null >>"${LOGS}/${name}.log" 2>&1 3>&- &
	local pid=$!
	echo "${name} ${pid}" >>"${PIDS}"
	log "${name} started (pid ${pid}, log ${LOGS}/${name}.log)"
}

# component_alive NAME fails when the last recorded process NAME has exited.
component_alive() {
	local pid
	pid="$(recorded_pids "$1" | tail -n 1)"
	[[ -n "${pid}" ]] && pid_alive "${pid}"
}

# await NAME WHAT cmd... waits up to UP_TIMEOUT seconds for cmd to succeed,
# and gives up at once, with NAME's log, when the process NAME died.
await() {
	local name="$1" what="$2"
	shift 2
	exec 3>&2
	if ! wait_until "${UP_TIMEOUT:-120}" "${what}" unless_dead "${name}" "$@"; then
		tail -n 30 "${LOGS}/${name}.log" >&2 || true
		die "${what}: not ready (see ${LOGS}/${name}.log)"
	fi
}

# unless_dead NAME cmd... runs cmd; exits the script when the process NAME
# died, since waiting longer is pointless.
unless_dead() {
	local name="$1"
	shift
	if ! component_alive "${name}"; then
		# wait_until hides the command's output: report on the saved stderr.
		{
			tail -n 30 "${LOGS}/${name}.log" || true
			die "${name} exited (see ${LOGS}/${name}.log)"
		} >&3 2>&3
	fi
	"$@"
}

# write_containerd_config writes CONTAINERD_DIR/config.toml: containerd
# with NRI on NRI_SOCK, CRI on CONTAINERD_SOCK with the cached pause image
# pinned, the native snapshotter, and CNI from CNI_BIN_DIR and the system's
# plugins with CNI_CONF_DIR's one network.
write_containerd_config() {
	local sandbox_image
	sandbox_image="$(cat "$(pause_cache_dir)/image-name")"
	if [[ "$(version_part "${CONTAINERD_VERSION}" 1)" == 1 ]]; then
		write_containerd_1_config "${sandbox_image}"
		return
	fi
	cat >"${CONTAINERD_DIR}/config.toml" <<EOF
# written by hack/$(basename "$0")
version = 3
root = '${CONTAINERD_DIR}/root'
state = '${CONTAINERD_DIR}/state'
imports = []
disabled_plugins = ['io.containerd.snapshotter.v1.btrfs', 'io.containerd.snapshotter.v1.zfs', 'io.containerd.snapshotter.v1.devmapper', 'io.containerd.snapshotter.v1.erofs']

[grpc]
  address = '${CONTAINERD_SOCK}'

[ttrpc]
  address = '${CONTAINERD_SOCK}.ttrpc'

[debug]
  level = 'info'

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '${CONTAINERD_DIR}/opt'

  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '${CONTAINERD_DIR}/image-verifier/bin'

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = '${NRI_SOCK}'
    plugin_path = '${NRI_DIR}/plugins'
    plugin_config_path = '${NRI_DIR}/conf.d'

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'native'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '${sandbox_image}'

  [plugins.'io.containerd.cri.v1.runtime']
    # Without it the sandbox asks for oom_score_adj -998, which needs
    # CAP_SYS_RESOURCE, and runc fails.
    restrict_oom_score_adj = true
    # Network namespaces under ROOT, so node-down.sh and cluster-down.sh
    # find and unmount them.
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      Root = '${ROOT}/runc'
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['${CNI_BIN_DIR}', '${CNI_SYSTEM_BIN_DIR}']
      conf_dir = '${CNI_CONF_DIR}'
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
EOF
}

# write_containerd_1_config writes the same node's configuration for
# containerd 1.7 (the configuration version 2 of that release), where NRI is
# off unless enabled here and the CRI plugin takes a single CNI bin_dir, so
# the system's plugins are linked into CNI_BIN_DIR. Usage: ... SANDBOX_IMAGE
write_containerd_1_config() {
	local p
	for p in "${CNI_SYSTEM_BIN_DIR}"/*; do
		[[ -e "${CNI_BIN_DIR}/$(basename "${p}")" ]] || ln -s "${p}" "${CNI_BIN_DIR}/"
	done
	cat >"${CONTAINERD_DIR}/config.toml" <<EOF
# written by hack/$(basename "$0") for containerd ${CONTAINERD_VERSION}
version = 2
root = '${CONTAINERD_DIR}/root'
state = '${CONTAINERD_DIR}/state'
disabled_plugins = ['io.containerd.snapshotter.v1.btrfs', 'io.containerd.snapshotter.v1.zfs', 'io.containerd.snapshotter.v1.devmapper', 'io.containerd.snapshotter.v1.aufs']

[grpc]
  address = '${CONTAINERD_SOCK}'

[ttrpc]
  address = '${CONTAINERD_SOCK}.ttrpc'

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '${CONTAINERD_DIR}/opt'

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = '${NRI_SOCK}'
    plugin_path = '${NRI_DIR}/plugins'
    plugin_config_path = '${NRI_DIR}/conf.d'

  [plugins.'io.containerd.grpc.v1.cri']
    sandbox_image = '$1'
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
    [plugins.'io.containerd.grpc.v1.cri'.containerd]
      snapshotter = 'native'
      default_runtime_name = 'runc'
      [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc.options]
          Root = '${ROOT}/runc'
    [plugins.'io.containerd.grpc.v1.cri'.cni]
      bin_dir = '${CNI_BIN_DIR}'
      conf_dir = '${CNI_CONF_DIR}'
      max_conf_num = 1
EOF
}

# kubelet_config_common prints the KubeletConfiguration lines every test
# kubelet shares (node-up.sh's and cluster-up.sh's): no cgroup v1, no QoS
# cgroups or node allocatable enforcement, swap allowed, pod logs under LOGS,
# and neither image GC nor eviction, which a test on a full disk would
# otherwise trigger.
kubelet_config_common() {
	cat <<EOF
failCgroupV1: false
cgroupsPerQOS: false
cgroupDriver: cgroupfs
enforceNodeAllocatable: []
failSwapOn: false
podLogsDir: ${LOGS}/pods
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
EOF
}

# write_cni_config writes CNI_CONF_DIR's one network, CNI_NETWORK: the bridge
# plugin on CNI_BRIDGE with host-local addresses from CNI_SUBNET, behind
# CNI_META_PLUGIN when that is set (a JSON object, a Multus-like plugin that
# gets the bridge as its "delegate"). ENV_NAME names where CNI_META_PLUGIN
# came from, for the error. Usage: write_cni_config ENV_NAME
write_cni_config() {
	local bridge plugins
	bridge="$(jq -n --arg br "${CNI_BRIDGE}" --arg subnet "${CNI_SUBNET}" --arg data "${ROOT}/cni/ipam" '{
		type: "bridge", bridge: $br, isGateway: true, ipMasq: false, hairpinMode: true,
		ipam: {type: "host-local", ranges: [[{subnet: $subnet}]], dataDir: $data}
	}')"
	plugins="[${bridge}]"
	if [[ -n "${CNI_META_PLUGIN}" ]]; then
		plugins="$(jq -n --argjson meta "${CNI_META_PLUGIN}" --argjson bridge "${bridge}" \
			'[$meta + {delegate: $bridge}]')" || die "$1 is not a JSON object"
	fi
	jq -n --arg name "${CNI_NETWORK}" --argjson plugins "${plugins}" \
		'{cniVersion: "1.0.0", name: $name, plugins: $plugins}' >"${CNI_CONF_DIR}/10-${CNI_NETWORK}.conflist"
	log "CNI: network ${CNI_NETWORK} on bridge ${CNI_BRIDGE} (${CNI_SUBNET}), plugins: $(jq -r '[.plugins[].type] | join(",")' "${CNI_CONF_DIR}/10-${CNI_NETWORK}.conflist")"
}

# ---------------------------------------------------------------------------
# Teardown (node-down.sh, cluster-down.sh)

# unmount_under DIR unmounts every mount point under DIR (DIR included),
# deepest first.
unmount_under() {
	local mounts m n=0
	mounts="$(awk -v r="$1" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo |
		awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2-)"
	[[ -n "${mounts}" ]] || return 0
	while read -r m; do
		# mountinfo escapes spaces and the like as octal: decode them.
		m="$(printf '%b' "${m}")"
		if umount "${m}" 2>/dev/null || umount -l "${m}" 2>/dev/null; then
			n=$((n + 1))
		else
			log "WARNING: could not unmount ${m}"
		fi
	done <<<"${mounts}"
	log "unmounted ${n} mount(s) under $1"
}

# ---------------------------------------------------------------------------
# Node checks

# ctr_ runs ctr against the node's containerd.
ctr_() {
	"${CONTAINERD_BIN_DIR}/ctr" --address "${CONTAINERD_SOCK}" "$@"
}

# pod_resources_answers succeeds when the kubelet's PodResources socket
# answers a v1 List with gRPC status 0 (plain gRPC over h2c, through curl).
pod_resources_answers() {
	[[ -S "${POD_RESOURCES_SOCK}" ]] || return 1
	printf '\0\0\0\0\0' | curl -sS --max-time 2 --http2-prior-knowledge \
		--unix-socket "${POD_RESOURCES_SOCK}" -H 'content-type: application/grpc' -H 'te: trailers' \
		--data-binary @- -D - -o /dev/null http://localhost/v1.PodResourcesLister/List |
		tr -d '\r' | grep -qi '^grpc-status: 0$'
}

# await_containerd waits until containerd answers and its NRI socket exists.
await_containerd() {
	await containerd "containerd on ${CONTAINERD_SOCK}" ctr_ version
	await containerd "NRI socket ${NRI_SOCK}" test -S "${NRI_SOCK}"
}

# pods_api_answers succeeds when the kubelet's Pods API socket answers a
# v1alpha1 ListPods with gRPC status 0 (plain gRPC over h2c, through curl).
pods_api_answers() {
	[[ -S "${PODS_API_SOCK}" ]] || return 1
	printf '\0\0\0\0\0' | curl -sS --max-time 2 --http2-prior-knowledge \
		--unix-socket "${PODS_API_SOCK}" -H 'content-type: application/grpc' -H 'te: trailers' \
		--data-binary @- -D - -o /dev/null http://localhost/v1alpha1.Pods/ListPods |
		tr -d '\r' | grep -qi '^grpc-status: 0$'
}

# await_kubelet waits until the kubelet's healthz, /pods and PodResources
# socket all answer, and its Pods API too when KUBELET_PODS_API is 1.
await_kubelet() {
	await kubelet "kubelet healthz on 127.0.0.1:${KUBELET_HEALTHZ_PORT}" \
		curl -fsS --max-time 2 "http://127.0.0.1:${KUBELET_HEALTHZ_PORT}/healthz"
	await kubelet "kubelet /pods on 127.0.0.1:${KUBELET_READONLY_PORT}" \
		curl -fsS --max-time 2 "http://127.0.0.1:${KUBELET_READONLY_PORT}/pods"
	await kubelet "kubelet PodResources on ${POD_RESOURCES_SOCK}" pod_resources_answers
	if [[ "${KUBELET_PODS_API:-0}" == 1 ]]; then
		await kubelet "kubelet Pods API on ${PODS_API_SOCK}" pods_api_answers
	fi
}

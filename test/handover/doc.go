// Package handover holds the test of issue 40's handover, run by the unit
// tests: two `podres-proxy serve` processes, as processes (built with the
// race detector when the test runs with it), with the same flags on the
// same state directory, PodResources socket, NRI socket and metrics port,
// each with its own --probe-socket (each pod's own emptyDir), as a
// DaemonSet's rolling update with maxSurge 1 runs them on a node. The node
// is the fake kubelet (test/fakekubelet) and nri's own runtime adaptation,
// with pods placed by koord-scheduler as in test/churn.
//
// A starts and is ready (its probe socket's /readyz, then `podres-proxy
// probe readyz`); 4 clients call List and Get every few milliseconds, half
// dialing per call (Multus), half on long-lived connections (DCGM
// exporter), while the runtime relays a pod's lifecycle every few
// milliseconds. B starts and is ready: the socket path is now B's. During
// the overlap a pod's sandbox starts and another's is removed; A then gets
// SIGTERM (or SIGKILL), and once it left NRI another pod starts and
// another is removed, which only B sees. On SIGTERM, A is held with
// SIGSTOP meanwhile (as a slow flush or a long call in flight holds it):
// when /proc/locks says A still holds the state directory then, B learns
// those pods while it waits, and must not become the writer before A is
// let go on (SIGCONT). The test checks:
//
//   - no call fails (with SIGKILL: none dialing per call; a long-lived
//     connection to A may fail the one call that finds A gone), and every
//     answer gives each pod exactly its devices (the kubelet's and its
//     annotation's);
//   - every NRI event's round trip during the overlap and A's end is
//     within a bound set from the median before B started (see nriFactor);
//   - the state directory, as B wrote it once it became the writer (read
//     with persist.ReadDir, then `podres-proxy inspect -o json`), records
//     the four pods: the started ones ready, the removed ones removed;
//   - B's log says it waited, then became the writer; A's (SIGTERM) that
//     it left NRI; A exits 0 on SIGTERM, and never removes the socket path
//     B took.
//
// A failed run keeps its directory (both logs, the state directory) and
// says where. Run it alone with
//
//	go test -race -count=1 -v ./test/handover/
//
// Before issue 40 (main at 17bd857), serve had no --probe-socket: A exits
// at once ("unknown flag: --probe-socket") and both tests fail. With the
// test patched to wait for readiness on --metrics-addr instead, B, once
// started, is "ready" at once (A answers on the shared port: why each pod
// needs a probe of its own) and exits with "open state store: state
// directory ... is in use by another podres-proxy (pid N)". Both checked
// by running the test on that commit.
package handover

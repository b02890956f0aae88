// Package e2e runs podres-proxy against a real node: containerd with NRI and
// CNI, and a standalone kubelet running static pods, all started under a
// temporary root by the hack/ scripts. Its tests run only when asked for,
// as root:
//
//	hack/build-node.sh                     # once; cached afterwards
//	PODRES_E2E=1 go test -v -count=1 -timeout 40m ./test/e2e/
//
// Without PODRES_E2E=1 (plain `go test ./...`) every test skips. Settings
// (environment):
//
//	PODRES_E2E_ARTIFACTS       where logs are kept (default <repo>/_output/e2e)
//	PODRES_E2E_REQUIRE_SERVE   1: fail, rather than skip the proxy's tests,
//	                           when `podres-proxy serve` is not implemented
//	PODRES_E2E_PROXY           0: run the node, the probe and the device
//	                           plugin against the kubelet alone
//	PODRES_E2E_SKIP_BUILD      1: do not run hack/build-node.sh first
//	PODRES_E2E_SERVE_ARGS      extra flags for `podres-proxy serve`
//	PODRES_E2E_TIMEOUT         watchdog for the run after the builds (default 30m)
//	PODRES_E2E_BRIDGE          the node's CNI bridge (default podrese2e0);
//	                           PODRES_CNI_SUBNET its subnet (10.88.77.0/24)
//	PODRES_E2E_PRUNE_WAIT      how long a removed pod may stay in the store
//	                           (default 3m)
//	PODRES_E2E_KEEP_ROOT       1: keep the node's root directory afterwards
//	PODRES_E2E_PODS_API        0: the kubelet's PodsAPI gate off, so serve
//	                           learns pods from /pods (default 1: the kubelet
//	                           serves its Pods API and serve watches it)
//
// Two test device plugins run against the kubelet: example.com/dev, and
// nvidia.com/vgpu with ids like HAMi's NVIDIA plugin (GPU-<uuid>-<n>), which
// serve is told is HAMi's resource (--hami-resources vgpu=nvidia.com/vgpu;
// see hamiResource for why not nvidia.com/gpu).
//
// The node, the proxy and the test device plugins are torn down at the end,
// also when a test fails, the watchdog fires or the run is interrupted; the
// node's logs, the proxy's log and the CNI probe's records are copied to the
// artifacts directory, and their tails are printed when a test failed.
package e2e

// Package cluster runs podres-proxy as users install it, on a real one-node
// cluster that hack/cluster-up.sh starts (etcd, kube-apiserver with
// Node,RBAC authorization, kube-controller-manager, kube-scheduler, containerd
// with NRI and a CNI bridge, a kubelet with webhook authentication and
// authorization and its Pods API, on by default from 1.37). Its tests run only when
// asked for, as root:
//
//	hack/build-cluster.sh                      # once; cached afterwards
//	PODRES_E2E=1 go test -v -count=1 -timeout 40m ./test/cluster/
//
// Without PODRES_E2E=1 (plain `go test ./...`) every test skips.
//
// The suite applies deploy/base with the real kubectl (-k), then creates
// pods through the API that a test binder (test/binder) places as
// Koordinator's scheduler does: the device allocation annotation is patched
// onto the pod, then the pod is bound. The CNI network is a Multus-like
// probe (test/cniprobe) in front of the bridge plugin: during each pod's CNI
// ADD it asks podres-proxy's socket, as the DaemonSet serves it on the host,
// for the pod's koordinator.sh/rdma devices, and records what it got.
// A pod holding a VF and a GPU is read by the DCGM exporter, NFD
// topology-updater, Multus and Kata emulations of test/clients, which must
// agree. The DaemonSet is rolled to a new image (podres-proxy:v2, imported by
// cluster-up as an image of its own) with the base's surge strategy while a
// pod holding a VF is created every 500 ms and a consumer pod (test/listloop,
// packed by hack/ociimage and imported into the cluster's containerd) calls
// List every 100 ms through the socket's hostPath directory, as a monitoring
// agent does: no CNI ADD may fail or miss its own VF, no List may fail, and
// the new pod's `inspect` must show the old pod's records and refusals. The
// Helm chart's release is rolled the same way by a helm upgrade. Then serve
// is killed with SIGKILL in its pod and the time until its socket answers
// again, the kubelet's restart included, is logged ("cluster: crash
// window"): deploy/README.md's figure.
// The first test (dra_test.go) runs a DRA driver of the suite's own
// (test/dradriver, built by hack/build-dradriver.sh) and installs deploy/base
// with deploy/components/dra-legacy-view: a pod given a DRA device for an
// extended resource is read through both sockets (docs/dra.md); it removes
// all of it again before the others run.
// watch_test.go, after the others, installs what it needs and checks that
// serve keeps the API server's objects by watches: changes seen within 2 s,
// and no LIST or GET over 5 minutes of a steady node by the API server's own
// request counters.
// scenarios_test.go's last test uninstalls the kustomize objects and installs the Helm chart
// (deploy/helm/podres-proxy, with Helm's Go SDK), and runs the smoke check
// again.
// After it, scrape_test.go installs deploy/base with
// deploy/components/podmonitor (and a stand-in of the PodMonitor CRD) and
// scrapes the daemon's HTTPS /metrics where the stored PodMonitor says, from
// the host and from pods (test/scrapeprobe): the real API server's reviews
// answer 401 without a token, 403 to a service account not granted get on
// /metrics, 200 to the PodMonitor's; it removes all of it again.
//
// serve runs with each of its pod sources (podsource_test.go): deploy/base
// as installed watches the kubelet's Pods API, up to and through the rolling
// update, and in the DRA test; the RBAC test (removing the ClusterRoleBinding) patches
// the DaemonSet so, and the Helm chart is installed with podsAPI.enabled:
// false, so serve reads /pods there. Each
// configuration is checked from serve's metrics, and the suite prints one
// "cluster: pod source reads" line per configuration at its end.
//
// Settings (environment):
//
//	PODRES_CLUSTER_E2E_ROOT       the cluster's directory (default
//	                              /var/tmp/podres-cluster-e2e)
//	PODRES_CLUSTER_E2E_ARTIFACTS  where logs are kept (default
//	                              <repo>/_output/cluster-e2e)
//
// The cluster is torn down by hack/cluster-down.sh at the end, also when a
// test fails or the run is interrupted; its logs are copied to the artifacts
// directory first.
package cluster

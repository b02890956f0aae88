package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podres-proxy/podres-proxy/test/binder"
	"github.com/podres-proxy/podres-proxy/test/e2eutil"
)

// The binder's scheduler name: the one podres-proxy believes Koordinator's
// allocations from by default.
const schedulerName = "koord-scheduler"

// harness is the running cluster.
type harness struct {
	repo, root, artifacts string
	env                   map[string]string // ROOT/cluster.env
	probeRecords          string
	client                kubernetes.Interface
	binder                *binder.Binder
	stopBinder            context.CancelFunc
	// source is the pod source of the daemon the tests installed last
	// (noSource once it was removed); reads are the counts of the daemons
	// already replaced or removed, by their configuration (podsource_test.go).
	source podSource
	reads  map[podSource]readCounts
}

var h *harness

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if run, err := e2eutil.Enabled("cluster", "it starts a cluster"); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: %v\n", err)
		return 1
	} else if !run {
		return m.Run()
	}
	var err error
	h, err = newHarness()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cluster: %v\n", err)
		return 1
	}
	// An interrupted run still tears the cluster down.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "cluster: %v: tearing the cluster down\n", s)
		h.teardown()
		os.Exit(1)
	}()
	defer h.teardown()
	if err := h.setup(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: setup: %v\n", err)
		return 1
	}
	code := m.Run()
	if s := readSummary(); s != "" {
		fmt.Println(s)
	}
	return code
}

func newHarness() (*harness, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	repo := filepath.Clean(filepath.Join(wd, "..", ".."))
	root := envOr("PODRES_CLUSTER_E2E_ROOT", "/var/tmp/podres-cluster-e2e")
	artifacts := envOr("PODRES_CLUSTER_E2E_ARTIFACTS", filepath.Join(repo, "_output", "cluster-e2e"))
	if err := os.MkdirAll(artifacts, 0o755); err != nil {
		return nil, fmt.Errorf("create the artifacts directory: %w", err)
	}
	return &harness{repo: repo, root: root, artifacts: artifacts, probeRecords: filepath.Join(root, "cniprobe.jsonl"),
		reads: map[podSource]readCounts{}}, nil
}

func (h *harness) setup() error {
	probeBin := filepath.Join(h.root, "cni", "bin", "podres-cniprobe")
	if err := h.runner().GoBuild(probeBin, "./test/cniprobe"); err != nil {
		return err
	}
	os.Remove(h.probeRecords)
	// Multus-like: the probe asks the socket the DaemonSet serves on the host.
	probe, err := json.Marshal(map[string]any{
		"type":         "podres-cniprobe",
		"socket":       "/var/run/podres-proxy/pod-resources/kubelet.sock",
		"resourceName": binder.RDMAResource,
		"recordFile":   h.probeRecords,
		"criSocket":    "/run/containerd/containerd.sock",
	})
	if err != nil {
		return fmt.Errorf("encode the CNI probe's config: %w", err)
	}
	if err := h.script("cluster-up", "hack/cluster-up.sh",
		"PODRES_CLUSTER_ROOT="+h.root,
		"PODRES_CLUSTER_DEPLOY=0",
		"PODRES_CLUSTER_CNI_META_PLUGIN="+string(probe),
		"PODRES_IMAGE_TAGS=v2"); err != nil {
		return err
	}
	h.env, err = readEnv(filepath.Join(h.root, "cluster.env"))
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", h.env["KUBECONFIG_ADMIN"])
	if err != nil {
		return fmt.Errorf("load the admin kubeconfig: %w", err)
	}
	h.client, err = kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client for the cluster: %w", err)
	}
	if err := h.logVersions(); err != nil {
		return err
	}
	if err := h.importConsumerImage(); err != nil {
		return err
	}
	h.binder = &binder.Binder{Client: h.client, SchedulerName: schedulerName, NodeName: h.env["NODE_NAME"]}
	ctx, cancel := context.WithCancel(context.Background())
	h.stopBinder = cancel
	go func() { _ = h.binder.Run(ctx) }()
	return nil
}

// logVersions prints the versions the cluster runs, as its node reports them
// to the API server, so that CI's log says which kubelet the suite ran on.
func (h *harness) logVersions() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node, err := h.client.CoreV1().Nodes().Get(ctx, h.env["NODE_NAME"], metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read node %s: %w", h.env["NODE_NAME"], err)
	}
	info := node.Status.NodeInfo
	fmt.Printf("cluster: kubelet %s, container runtime %s (node %s)\n", info.KubeletVersion, info.ContainerRuntimeVersion, node.Name)
	return nil
}

// consumerImage is test/listloop's image, the rolling update's consumer pod.
const consumerImage = "docker.io/library/podres-listloop:test"

// importConsumerImage builds test/listloop, packs it as hack/ociimage packs
// the daemon (one static binary on an empty base) and imports it into the
// cluster's containerd.
func (h *harness) importConsumerImage() error {
	bin := filepath.Join(h.root, "images", "listloop")
	if err := h.runner().GoBuild(bin, "./test/listloop"); err != nil {
		return err
	}
	pack := exec.Command(e2eutil.GoBin(), "run", "./hack/ociimage", "--binary", bin, "--name", consumerImage,
		"--path", "/listloop", "--entrypoint", "/listloop", "--cmd", "", "--user", "0", "-o", bin+".tar")
	pack.Dir = h.repo
	if err := h.runner().Run("pack-listloop", pack); err != nil {
		return err
	}
	return h.runner().Run("import-listloop", exec.Command(h.env["CTR"], "--address", h.env["CONTAINERD_SOCK"],
		"-n", "k8s.io", "images", "import", "--local", "--snapshotter", "native", bin+".tar"))
}

func (h *harness) teardown() {
	if h.stopBinder != nil {
		h.stopBinder()
	}
	h.saveArtifacts()
	if err := h.script("cluster-down", "hack/cluster-down.sh", "PODRES_CLUSTER_ROOT="+h.root); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: %v\n", err)
	}
}

// saveArtifacts copies the cluster's logs and settings, and the probe's
// records, to the artifacts directory.
func (h *harness) saveArtifacts() {
	for _, rel := range []string{"logs", "cluster.env", "kubelet-config.yaml", "containerd/config.toml", "cni/net.d", "cniprobe.jsonl"} {
		src := filepath.Join(h.root, rel)
		if _, err := os.Stat(src); err != nil {
			continue
		}
		dst := filepath.Join(h.artifacts, rel)
		_ = os.RemoveAll(dst)
		_ = os.MkdirAll(filepath.Dir(dst), 0o755)
		if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "cluster: saving %s: %v: %s\n", rel, err, out)
		}
	}
}

// script runs a hack/ script; arguments of the form PODRES_X=Y go into its
// environment.
func (h *harness) script(name, path string, argsAndEnv ...string) error {
	return h.runner().Script(context.Background(), name, path, argsAndEnv...)
}

func (h *harness) runner() e2eutil.Runner {
	return e2eutil.Runner{Repo: h.repo, Artifacts: h.artifacts, Suite: "cluster"}
}

// kubectl runs the cluster's kubectl as the cluster admin and returns its
// output.
func kubectl(args ...string) (string, error) {
	cmd := exec.Command(h.env["KUBECTL"], append([]string{"--kubeconfig", h.env["KUBECONFIG_ADMIN"]}, args...)...)
	cmd.Dir = h.repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// kubectlOut is kubectl with its standard output alone returned (its
// standard error goes into the error).
func kubectlOut(args ...string) (string, error) {
	cmd := exec.Command(h.env["KUBECTL"], append([]string{"--kubeconfig", h.env["KUBECONFIG_ADMIN"]}, args...)...)
	cmd.Dir = h.repo
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// readEnv reads the KEY=VALUE lines cluster-up.sh wrote.
func readEnv(path string) (map[string]string, error) {
	return e2eutil.ReadEnvFile(path, "KUBECTL", "KUBECONFIG_ADMIN", "NODE_NAME", "POD_RESOURCES_SOCK", "PROXY_SOCKET_DIR", "PAUSE_IMAGE", "CTR", "CONTAINERD_SOCK", "PROXY_STATE_DIR")
}

// envOr, poll, pollErr and permanentf are test/e2eutil's.
var (
	envOr      = e2eutil.EnvOr
	pollErr    = e2eutil.PollErr
	permanentf = e2eutil.Permanentf
)

func poll(t *testing.T, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	e2eutil.Poll(t, timeout, what, fn)
}

// requireCluster skips the test unless the suite started a cluster.
func requireCluster(t *testing.T) {
	t.Helper()
	if h == nil || h.client == nil {
		t.Skip("cluster e2e disabled: set PODRES_E2E=1 and run as root (see doc.go)")
	}
}

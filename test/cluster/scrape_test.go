package cluster

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podres-proxy/podres-proxy/test/e2eutil"
)

// The scrape test's overlay (deploy/base with deploy/components/podmonitor)
// and the stand-in of the PodMonitor CRD it needs.
const (
	scrapeOverlay  = "test/cluster/testdata/scrape"
	podMonitorCRD  = "test/cluster/testdata/scrape/podmonitor-crd.yaml"
	scrapeProbeImg = "docker.io/library/podres-scrapeprobe:test"
	strangerSA     = "scrape-stranger"
)

// TestMetricsOverHTTPSOnlyToTheServiceAccountThePodMonitorNames installs
// deploy/base with deploy/components/podmonitor, as an operator does for the
// cluster's Prometheus, and scrapes the daemon's /metrics where the
// PodMonitor (as the API server stores it) says: https://<pod IP, the
// node's>:<port>/metrics, without verifying the self-signed certificate.
// The daemon asks the real API server (TokenReview, SubjectAccessReview):
// no token is 401, a service account not granted get on /metrics is 403,
// the token the PodMonitor names (the scraper's Secret) is 200, as is a
// token minted for that account by the TokenRequest API. The same three
// scrapes are made from pods on the pod network (test/scrapeprobe, packed
// by hack/ociimage), each with its own service account's token, to the
// node's address on that network. Throughout,
// the daemon stays Ready through its exec probes, without a restart, and
// its loopback /metrics answers as before.
//
// It installs and removes everything it uses, so it runs alone (-run) or
// after the other tests (files run in name order; the Helm test before it
// uninstalls its release).
func TestMetricsOverHTTPSOnlyToTheServiceAccountThePodMonitorNames(t *testing.T) {
	requireCluster(t)
	if out, err := kubectl("apply", "-f", podMonitorCRD); err != nil {
		t.Fatal(err)
	} else {
		t.Log(out)
	}
	t.Cleanup(func() {
		if _, err := kubectl("delete", "-f", podMonitorCRD, "--wait", "--timeout=60s"); err != nil {
			t.Errorf("delete the PodMonitor CRD: %v", err)
		}
	})
	if _, err := kubectl("wait", "--for=condition=Established", "crd/podmonitors.monitoring.coreos.com", "--timeout=60s"); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("apply", "-k", scrapeOverlay); err != nil {
		t.Fatal(err)
	} else {
		t.Log(out)
	}
	t.Cleanup(func() {
		retireDaemon()
		// The namespace's deletion takes the Secret with it: not found is
		// no failure.
		if _, err := kubectl("delete", "-k", scrapeOverlay, "--wait", "--timeout=180s", "--ignore-not-found"); err != nil {
			t.Errorf("uninstall podres-proxy: %v", err)
		}
	})
	// Ready: the readiness probe (podres-proxy probe readyz, the pod's own
	// probe socket) passed with the HTTPS listener on.
	if _, err := kubectl("-n", "podres-proxy", "rollout", "status", "daemonset/podres-proxy", "--timeout=180s"); err != nil {
		out, _ := kubectl("-n", "podres-proxy", "describe", "pods")
		t.Fatalf("%v\n%s", err, out)
	}
	useSource(t, "podres-proxy", viaPodsAPI)
	daemon := daemonPod(t, "podres-proxy")

	ep := storedPodMonitor(t)
	if ep.Scheme != "https" || ep.Path != "/metrics" || ep.TLSConfig.InsecureSkipVerify != true || ep.Authorization.Credentials.Name == "" {
		t.Fatalf("the stored PodMonitor's endpoint %+v: want https, /metrics, a self-signed certificate not verified, a Secret's token", ep)
	}
	target := ep.address(t, daemon.Status.PodIP)
	url := "https://" + target + "/metrics"
	t.Logf("the PodMonitor scrapes %s (pod %s on the host network)", url, daemon.Name)

	scraperToken := secretToken(t, ep.Authorization.Credentials.Name, ep.Authorization.Credentials.Key)
	if _, err := kubectl("-n", "podres-proxy", "create", "serviceaccount", strangerSA); err != nil {
		t.Fatal(err)
	}
	strangerToken := mintToken(t, strangerSA)
	mintedScraperToken := mintToken(t, "podres-proxy-scraper")

	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}}
	get := func(url, token string) (int, string, error) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		return resp.StatusCode, string(body), err
	}
	// Each answer awaited: the listener starts beside the socket, RBAC
	// reaches the API server's authorizer a moment after the apply, and a
	// refusal is kept 10 s.
	expect := func(who, url, token string, want int) string {
		t.Helper()
		var body string
		poll(t, time.Minute, fmt.Sprintf("%s's scrape answered %d", who, want), func() error {
			code, b, err := get(url, token)
			if err != nil {
				return err
			}
			if code != want {
				return fmt.Errorf("status %d: %.200s", code, b)
			}
			body = b
			return nil
		})
		return body
	}
	start := time.Now()
	expect("a caller without a token", url, "", http.StatusUnauthorized)
	expect("a forged token", url, "not-a-token", http.StatusUnauthorized)
	expect("service account "+strangerSA+" (not granted get /metrics)", url, strangerToken, http.StatusForbidden)
	body := expect("the PodMonitor's token (service account podres-proxy-scraper)", url, scraperToken, http.StatusOK)
	if !strings.Contains(body, "\npodres_proxy_state_writer ") || !strings.Contains(body, "\ngo_goroutines ") {
		t.Errorf("the granted scrape's body has no podres_proxy_ series: %.300s", body)
	}
	expect("a token minted for podres-proxy-scraper", url, mintedScraperToken, http.StatusOK)
	t.Logf("the host's scrapes answered 401, 401, 403, 200, 200 within %s", time.Since(start).Round(time.Millisecond))
	if code, b, err := get("http://"+target+"/metrics", scraperToken); err == nil && (code != http.StatusBadRequest || strings.Contains(b, "podres_proxy_")) {
		t.Errorf("plain HTTP to the HTTPS port: %d %.200s, want 400 and no metrics", code, b)
	}
	if _, err := metric("podres_proxy_state_writer"); err != nil {
		t.Errorf("the loopback --metrics-addr no longer answers: %v", err)
	}

	// From pods on the pod network, each with its own service account's
	// token, as Prometheus scrapes from its pod. The suite's bridge network
	// gives pods no default route, so they reach the node at the bridge's
	// gateway address: the same listener (--metrics-secure-addr=:9478
	// listens on every node address) on the same port.
	importScrapeProbe(t)
	_, port, _ := net.SplitHostPort(target)
	podURL := "https://" + net.JoinHostPort(bridgeGateway(t), port) + "/metrics"
	for _, tc := range []struct {
		name, account string
		args          []string
		want          string
	}{
		{"scrape-granted", "podres-proxy-scraper", nil, "status 200"},
		{"scrape-stranger", strangerSA, nil, "status 403"},
		{"scrape-anonymous", strangerSA, []string{"--token-file="}, "status 401"},
	} {
		got := probeFromPod(t, tc.name, tc.account, append([]string{"--url", podURL, "--insecure-skip-verify"}, tc.args...))
		if !strings.HasPrefix(got, tc.want+" ") {
			t.Errorf("pod %s (service account %s) scraped: %q, want %s", tc.name, tc.account, got, tc.want)
		} else {
			t.Logf("pod %s (service account %s): %s", tc.name, tc.account, got)
		}
	}

	// The probes kept the daemon Ready throughout, without a restart.
	now, err := h.client.CoreV1().Pods("podres-proxy").Get(context.Background(), daemon.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := false
	for _, c := range now.Status.Conditions {
		ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
	}
	if !ready || restarts(now) != restarts(daemon) {
		t.Errorf("daemon pod %s: Ready %v, restarts %d (were %d)", now.Name, ready, restarts(now), restarts(daemon))
	}
}

// podMetricsEndpoint is the part of the stored PodMonitor's endpoint the
// test follows, as Prometheus Operator reads it.
type podMetricsEndpoint struct {
	Scheme        string `json:"scheme"`
	Path          string `json:"path"`
	Authorization struct {
		Credentials struct {
			Name string `json:"name"`
			Key  string `json:"key"`
		} `json:"credentials"`
	} `json:"authorization"`
	TLSConfig struct {
		InsecureSkipVerify bool `json:"insecureSkipVerify"`
	} `json:"tlsConfig"`
	Relabelings []struct {
		SourceLabels []string `json:"sourceLabels"`
		Regex        string   `json:"regex"`
		TargetLabel  string   `json:"targetLabel"`
		Replacement  string   `json:"replacement"`
	} `json:"relabelings"`
}

// storedPodMonitor reads the PodMonitor podres-proxy back from the API
// server and returns its one endpoint.
func storedPodMonitor(t *testing.T) podMetricsEndpoint {
	t.Helper()
	out, err := kubectlOut("-n", "podres-proxy", "get", "podmonitors.monitoring.coreos.com", "podres-proxy", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var pm struct {
		Spec struct {
			PodMetricsEndpoints []podMetricsEndpoint `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(out), &pm); err != nil {
		t.Fatalf("the PodMonitor: %v", err)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("the PodMonitor has %d endpoints, want 1", len(pm.Spec.PodMetricsEndpoints))
	}
	return pm.Spec.PodMetricsEndpoints[0]
}

// address returns the target's address for a pod at ip: the relabelings of
// __address__ from the pod's IP applied as Prometheus applies them.
func (ep podMetricsEndpoint) address(t *testing.T, ip string) string {
	t.Helper()
	addr := ""
	for _, r := range ep.Relabelings {
		if r.TargetLabel != "__address__" || len(r.SourceLabels) != 1 || r.SourceLabels[0] != "__meta_kubernetes_pod_ip" {
			continue
		}
		re := regexp.MustCompile("^(?:" + r.Regex + ")$")
		if re.MatchString(ip) {
			addr = re.ReplaceAllString(ip, r.Replacement)
		}
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		t.Fatalf("the PodMonitor's relabelings make %q of pod IP %s: %v", addr, ip, err)
	}
	return addr
}

// bridgeGateway returns the node's address on the suite's pod network: the
// first address of the bridge's subnet (host-local's gateway), from the CNI
// configuration cluster-up wrote.
func bridgeGateway(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(h.root, "cni", "net.d", "10-podres-cluster.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`"subnet":\s*"([0-9.]+)/([0-9]+)"`).FindStringSubmatch(string(data))
	if m == nil {
		t.Fatalf("no IPv4 subnet in the CNI configuration:\n%s", data)
	}
	ip := net.ParseIP(m[1]).To4()
	gw := net.IPv4(ip[0], ip[1], ip[2], ip[3]+1)
	return gw.String()
}

// secretToken waits for the token controller to fill the Secret's key and
// returns the token.
func secretToken(t *testing.T, name, key string) string {
	t.Helper()
	var token string
	poll(t, time.Minute, "Secret "+name+"'s "+key+" filled by the token controller", func() error {
		s, err := h.client.CoreV1().Secrets("podres-proxy").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(s.Data[key]) == 0 {
			return fmt.Errorf("no %s yet", key)
		}
		token = string(s.Data[key])
		return nil
	})
	return token
}

// mintToken returns a token of service account sa (namespace podres-proxy)
// from the TokenRequest API.
func mintToken(t *testing.T, sa string) string {
	t.Helper()
	out, err := kubectlOut("-n", "podres-proxy", "create", "token", sa, "--duration=10m")
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(out)
	if _, err := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[0]); err != nil || strings.Count(token, ".") != 2 {
		t.Fatalf("kubectl create token %s printed %q, not a JWT", sa, token)
	}
	return token
}

// importScrapeProbe builds test/scrapeprobe, packs it as hack/ociimage
// packs the daemon and imports it into the cluster's containerd.
func importScrapeProbe(t *testing.T) {
	t.Helper()
	bin := filepath.Join(h.root, "images", "scrapeprobe")
	if err := h.runner().GoBuild(bin, "./test/scrapeprobe"); err != nil {
		t.Fatal(err)
	}
	pack := exec.Command(e2eutil.GoBin(), "run", "./hack/ociimage", "--binary", bin, "--name", scrapeProbeImg,
		"--path", "/scrapeprobe", "--entrypoint", "/scrapeprobe", "--cmd", "", "--user", "65534", "-o", bin+".tar")
	pack.Dir = h.repo
	if err := h.runner().Run("pack-scrapeprobe", pack); err != nil {
		t.Fatal(err)
	}
	if err := h.runner().Run("import-scrapeprobe", exec.Command(h.env["CTR"], "--address", h.env["CONTAINERD_SOCK"],
		"-n", "k8s.io", "images", "import", "--local", "--snapshotter", "native", bin+".tar")); err != nil {
		t.Fatal(err)
	}
}

// probeFromPod runs test/scrapeprobe with args in a pod of namespace
// podres-proxy, on the pod network, as service account sa (its token
// mounted), and returns the line it printed.
func probeFromPod(t *testing.T, name, sa string, args []string) string {
	t.Helper()
	ctx := context.Background()
	pods := h.client.CoreV1().Pods("podres-proxy")
	mount, grace := true, int64(0)
	_, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:                      h.env["NODE_NAME"],
			ServiceAccountName:            sa,
			AutomountServiceAccountToken:  &mount,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "scrape", Image: scrapeProbeImg, ImagePullPolicy: corev1.PullNever, Args: args,
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { _ = pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &grace}) })
	poll(t, podTimeout, "pod "+name+" to finish", func() error {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		switch p.Status.Phase {
		case corev1.PodSucceeded:
			return nil
		case corev1.PodFailed:
			return permanentf("pod %s failed: %s", name, p.Status.Message)
		}
		return fmt.Errorf("pod %s is %s", name, p.Status.Phase)
	})
	raw, err := pods.GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("pod %s's log: %v", name, err)
	}
	return strings.TrimSpace(string(raw))
}

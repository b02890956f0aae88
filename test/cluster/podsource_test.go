package cluster

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The cluster's kubelet serves its Pods API (hack/cluster-up.sh turns the
// PodsAPI gate on), so the suite runs serve with each of its pod sources on
// the one cluster:
//
//   - viaPodsAPI: deploy/base as installed, whose DaemonSet mounts the
//     kubelet's pods-api directory: serve watches the Pods API and reads
//     /pods only while its watch is not synced. The smoke check, the
//     workloads, the StatefulSet successor, the clients' agreement, the
//     rolling update and the DRA test (its overlay adds the legacy view)
//     run so.
//   - viaPods: serve with --kubelet-pods-api-socket= (the RBAC test
//     patches deploy/base's DaemonSet so; the Helm chart is installed with
//     podsAPI.enabled: false): serve reads /pods over HTTPS with its token
//     and RBAC, as on a kubelet without the gate.
//
// Each configuration is checked to be the one it claims from serve's
// metrics (checkSource), and the suite ends with one line per
// configuration giving the reads of every pod its daemons made, by source.
type podSource int

const (
	noSource podSource = iota
	viaPodsAPI
	viaPods
)

func (s podSource) String() string {
	switch s {
	case viaPodsAPI:
		return "the kubelet's Pods API (deploy/base as installed, and with the DRA legacy view: the watch, /pods as the fallback)"
	case viaPods:
		return "/pods (--kubelet-pods-api-socket=: the RBAC test's patched base, the Helm chart with podsAPI.enabled=false)"
	}
	return "none"
}

// readCounts are a daemon's counts of its reads of every pod and of its
// Pods API watch, from its metrics.
type readCounts struct {
	// shared are the reads from either source that queries shared
	// (podres_proxy_kubelet_pods_reads_total), failed those that failed.
	shared, failed float64
	// pods and podsAPI split the successful ones by the source that
	// answered (podres_proxy_pod_source_reads_total{source}).
	pods, podsAPI float64
	// events and relists are the Pods API watch's.
	events, relists float64
}

// daemonReads reads the running daemon's counts.
func daemonReads() (readCounts, error) {
	var c readCounts
	for _, m := range []struct {
		prefix string
		dst    *float64
	}{
		{"podres_proxy_kubelet_pods_reads_total{", &c.shared},
		{`podres_proxy_kubelet_pods_reads_total{result="error"}`, &c.failed},
		{`podres_proxy_pod_source_reads_total{source="pods"}`, &c.pods},
		{`podres_proxy_pod_source_reads_total{source="pods-api"}`, &c.podsAPI},
		{"podres_proxy_pods_api_events_total{", &c.events},
		{"podres_proxy_pods_api_relists_total ", &c.relists},
	} {
		v, err := metric(m.prefix)
		if err != nil {
			return c, fmt.Errorf("podres-proxy's metrics: %w", err)
		}
		*m.dst = v
	}
	return c, nil
}

func mustReads(t *testing.T) readCounts {
	t.Helper()
	c, err := daemonReads()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (c readCounts) since(b readCounts) readCounts {
	return readCounts{c.shared - b.shared, c.failed - b.failed, c.pods - b.pods, c.podsAPI - b.podsAPI,
		c.events - b.events, c.relists - b.relists}
}

func (c readCounts) plus(b readCounts) readCounts {
	return readCounts{c.shared + b.shared, c.failed + b.failed, c.pods + b.pods, c.podsAPI + b.podsAPI,
		c.events + b.events, c.relists + b.relists}
}

// describe says what the counts are for a daemon reading source.
func (c readCounts) describe(source podSource) string {
	if source == viaPods {
		return fmt.Sprintf("%v reads of every pod, all from /pods (%v failed, %v counted by source); the Pods API: %v reads, %v watch events, %v relists",
			c.shared, c.failed, c.pods, c.podsAPI, c.events, c.relists)
	}
	return fmt.Sprintf("%v shared reads of every pod (%v failed): %v from /pods, %v from the Pods API; %v Pods API watch events, %v relists",
		c.shared, c.failed, c.pods, c.podsAPI, c.events, c.relists)
}

// useSource records that the daemon now running in namespace (just rolled
// out) is configured for source, and checks that it is: its arguments
// disable the Pods API exactly when source is viaPods, and with the Pods
// API its watch of the kubelet has relisted (the kubelet serves it, and
// serve watches it); without, the watch never ran.
func useSource(t *testing.T, namespace string, source podSource) {
	t.Helper()
	disabled := slices.Contains(daemonPod(t, namespace).Spec.Containers[0].Args, "--kubelet-pods-api-socket=")
	if disabled != (source == viaPods) {
		t.Fatalf("the daemon in %s is to read %s, but its arguments disable the Pods API: %v", namespace, source, disabled)
	}
	h.source = source
	switch source {
	case viaPodsAPI:
		poll(t, time.Minute, "serve's watch of the kubelet's Pods API relists", func() error {
			c, err := daemonReads()
			if err == nil && c.relists < 1 {
				err = fmt.Errorf("podres_proxy_pods_api_relists_total is %v", c.relists)
			}
			return err
		})
	case viaPods:
		checkPodsAPIUnused(t, mustReads(t))
	}
	t.Logf("serve reads %s: %s", source, mustReads(t).describe(source))
}

// checkPodsAPIUnused fails when a daemon with the Pods API disabled has
// used it, or has not counted its successful reads as /pods's.
func checkPodsAPIUnused(t *testing.T, c readCounts) {
	t.Helper()
	if c.podsAPI != 0 || c.events != 0 || c.relists != 0 {
		t.Errorf("serve, its Pods API disabled, used it: %s", c.describe(viaPods))
	}
	// A read is counted by source when it returns and as a shared read
	// when its reader records it, just after: one in flight during the
	// scrape may be in the first count only.
	if c.pods < c.shared-c.failed {
		t.Errorf("serve, its Pods API disabled, did not count each successful read as /pods's: %s", c.describe(viaPods))
	}
}

// checkSource checks what the daemon read while pods were created, from
// its counts before and after: none of its reads failed and, with the Pods
// API, none was of /pods (the pods were learned from the watch, whose
// events came); with /pods, it read /pods, and never the Pods API.
func checkSource(t *testing.T, before, after readCounts) {
	t.Helper()
	d := after.since(before)
	t.Logf("serve, reading %s, while the pods were created: %s", h.source, d.describe(h.source))
	if d.failed != 0 {
		t.Errorf("%v reads of the kubelet's pods failed while the pods were created", d.failed)
	}
	switch h.source {
	case viaPodsAPI:
		if d.pods != 0 {
			t.Errorf("serve read the kubelet's /pods %v times while it watched the Pods API", d.pods)
		}
		if d.events == 0 {
			t.Errorf("serve received no Pods API watch event while pods were created")
		}
	case viaPods:
		if d.shared-d.failed <= 0 {
			t.Errorf("serve, configured for /pods, did not read it while pods were created")
		}
		checkPodsAPIUnused(t, after)
	default:
		t.Errorf("no pod source recorded for the running daemon")
	}
}

// retireDaemon adds the running daemon's counts to its configuration's,
// before the daemon is replaced or removed.
func retireDaemon() {
	if h.source == noSource {
		return
	}
	if c, err := daemonReads(); err == nil {
		h.reads[h.source] = h.reads[h.source].plus(c)
	}
	h.source = noSource
}

// readSummary is the suite's last word on what serve read: one line per
// configuration, the reads of every daemon that ran so.
func readSummary() string {
	retireDaemon()
	var lines []string
	for _, s := range []podSource{viaPodsAPI, viaPods} {
		c, ok := h.reads[s]
		if !ok {
			continue
		}
		lines = append(lines, fmt.Sprintf("cluster: pod source reads, serve reading %s, by every serve of the configuration: %s", s, c.describe(s)))
	}
	return strings.Join(lines, "\n")
}

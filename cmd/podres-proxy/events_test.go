package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/report"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/persist"
)

// nopMetrics is plugin.Metrics counting nothing.
type nopMetrics struct{}

func (nopMetrics) NRIEvent(string, time.Duration)     {}
func (nopMetrics) NRIConnected(bool)                  {}
func (nopMetrics) NRIReconnect()                      {}
func (nopMetrics) CRIReconciled(time.Duration, error) {}

// The daemon's own trouble is reported on the Node once per episode, and
// only once it lasted troubleAfter: the NRI plugin not registered, the
// kubelet's pods unreadable; failing state writes at once.
func TestTheDaemonsTroubleIsReportedOnTheNodeOncePerEpisode(t *testing.T) {
	start := time.Now()
	e := &eventsWiring{nriSince: start, podsOK: start}
	var got []string
	tr := &trouble{e: e, node: func(reason, _, note string) { got = append(got, reason+": "+note) }}
	nri := e.watchNRI(nopMetrics{})
	fetch := e.watchPods(func(context.Context) ([]model.KubeletPod, error) { return nil, errors.New("403 Forbidden") })
	_, _ = fetch(context.Background())

	tr.check(start.Add(troubleAfter/2), state.Stats{})
	if len(got) != 0 {
		t.Fatalf("reported %q before the trouble lasted %s", got, troubleAfter)
	}
	tr.check(start.Add(troubleAfter), state.Stats{})
	tr.check(start.Add(2*troubleAfter), state.Stats{})
	if len(got) != 2 || !strings.HasPrefix(got[0], report.ReasonNRIDisconnected) ||
		!strings.HasPrefix(got[1], report.ReasonKubeletPodsUnreadable) || !strings.Contains(got[1], "403 Forbidden") {
		t.Fatalf("reported %q, want NRIDisconnected and KubeletPodsUnreadable (with its error), once each", got)
	}

	// Both recover, then fail again: a new episode each.
	nri.NRIConnected(true)
	e.mu.Lock()
	e.podsOK, e.podsErr = time.Now(), time.Time{}
	e.mu.Unlock()
	tr.check(time.Now(), state.Stats{})
	nri.NRIConnected(false)
	tr.check(time.Now().Add(troubleAfter), state.Stats{})
	if len(got) != 3 || !strings.HasPrefix(got[2], report.ReasonNRIDisconnected) {
		t.Fatalf("after NRI came back and went again, reported %q", got[2:])
	}

	// Writes fail: reported at once, once, until nothing waits.
	now := time.Now()
	failing := state.Stats{Stats: persist.Stats{WriteErrors: 2, Pending: 3}}
	tr.check(now, failing)
	failing.WriteErrors = 5
	tr.check(now, failing)
	if len(got) != 4 || !strings.HasPrefix(got[3], report.ReasonStateWritesFailing) {
		t.Fatalf("with failing writes, reported %q", got[3:])
	}
	tr.check(now, state.Stats{Stats: persist.Stats{WriteErrors: 5}})
	tr.check(now, state.Stats{Stats: persist.Stats{WriteErrors: 6, Pending: 1}})
	if len(got) != 5 {
		t.Fatalf("writes failing again after they were all written: reported %q", got[4:])
	}
}

// Without an API server, or with --events=false, serve runs without
// Events, and its parts are given what they were.
func TestEventsAreOffWithoutAnAPIServerOrWhenTurnedOff(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, c := range []*serveConfig{
		{events: true, nodeName: "node-a"},
		{events: false, nodeName: "node-a", apiServer: "https://127.0.0.1:6443"},
		{events: true, apiServer: "https://127.0.0.1:6443"},
	} {
		log := logrus.New()
		log.SetOutput(io.Discard)
		if e := c.newEvents(nil, log); e != nil {
			t.Errorf("%+v: Events on", c)
		}
	}
	var e *eventsWiring
	if e.report() != nil || e.draUnfolded(nil) != nil {
		t.Error("Events off, yet something reports")
	}
	if err := e.run(nil)(context.Background()); err != nil {
		t.Error(err)
	}
}

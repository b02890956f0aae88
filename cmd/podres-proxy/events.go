package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/dra"
	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/metrics"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/plugin"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/report"
	"github.com/podres-proxy/podres-proxy/state"
)

// troubleAfter is how long the daemon's own trouble lasts before it is
// reported on the Node: an NRI reconnect while the runtime restarts, or a
// /pods read failing once, is no news.
const troubleAfter = time.Minute

// troubleEvery is how often the daemon's own trouble is looked at.
const troubleEvery = 5 * time.Second

// eventsWiring is serve's Events (package report): the reporter the plans
// tell of pods' decisions, and what watches the daemon's own trouble (NRI
// disconnected, the kubelet's pods unreadable, state writes failing) for
// Events on the Node. A nil *eventsWiring (Events off) changes nothing.
type eventsWiring struct {
	reporter *report.Reporter
	log      logrus.FieldLogger

	mu       sync.Mutex
	nriWatch bool      // the NRI plugin runs
	nriUp    bool      // it is registered with the runtime
	nriSince time.Time // when nriUp last changed (the start until then)
	podsOK   time.Time // the last successful read of the kubelet's pods
	podsErr  time.Time // the last failed one, after podsOK
	podsWhy  string
}

// newEvents returns serve's Events: on by default (--events) wherever serve
// has an API server (--api-server, or in a pod) and knows its node; nil
// when off.
func (c *serveConfig) newEvents(m *metrics.Metrics, log logrus.FieldLogger) *eventsWiring {
	switch {
	case !c.events:
		return nil
	case c.apiServer == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "":
		log.Info("Events off: not in a cluster and no --api-server")
		return nil
	case c.nodeName == "":
		log.Info("Events off: no --node-name (or NODE_NAME), the Events' reporting instance")
		return nil
	}
	cfg, err := apiclient.Config(apiclient.Options{Server: c.apiServer, TokenFile: c.apiTokenFile, CAFile: c.apiCAFile})
	if err == nil {
		var r *report.Reporter
		if r, err = report.New(report.Options{Config: cfg, Node: c.nodeName, Metrics: m, Log: log}); err == nil {
			now := time.Now()
			return &eventsWiring{reporter: r, log: log, nriSince: now, podsOK: now}
		}
	}
	// Never fatal: the answers do not depend on Events.
	log.WithError(err).Warn("Events off: no client for the API server")
	return nil
}

// report returns the reporter the plans tell; nil when Events are off.
func (e *eventsWiring) report() plans.Reporter {
	if e == nil {
		return nil // not a nil *report.Reporter in the interface
	}
	return e.reporter
}

// draUnfolded returns what tells of a DRA device the legacy view could not
// fold, as an Event on its pod, when the store knows the pod's UID; nil
// when Events are off.
func (e *eventsWiring) draUnfolded(store *state.Store) func(model.PodKey, dra.Unfolded) {
	if e == nil {
		return nil
	}
	why := map[string]string{
		dra.ReasonNoSlice:      "no ResourceSlice of the node lists it",
		dra.ReasonNoID:         "its ResourceSlice gives none of the id attributes (--dra-id-attributes)",
		dra.ReasonUnattributed: "its claim serves several containers or resources, and its allocation is unknown or names no request of this container",
	}
	return func(key model.PodKey, u dra.Unfolded) {
		rec, ok := store.KubeletNamed(key)
		if !ok {
			return // no UID: no Event
		}
		e.reporter.Pod(model.PodRef{UID: rec.UID, Namespace: rec.Namespace, Name: rec.Name}, report.ReasonDRADeviceNotFolded,
			"Fold "+u.Device.String(), fmt.Sprintf("DRA device %s of container %s is left under dynamic_resources in the legacy view (%s): %s",
				u.Device, u.Container, u.Reason, cmp.Or(why[u.Reason], u.Reason)))
	}
}

// run emits Events until ctx is done; nothing when Events are off.
func (e *eventsWiring) run(store *state.Store) func(context.Context) error {
	return func(ctx context.Context) error {
		if e == nil {
			return nil
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.watchTrouble(ctx, store)
		}()
		err := e.reporter.Run(ctx)
		<-done
		return err
	}
}

// watchNRI returns m, also telling e when the NRI plugin registers with the
// runtime and when it loses the connection.
func (e *eventsWiring) watchNRI(m plugin.Metrics) plugin.Metrics {
	if e == nil {
		return m
	}
	e.mu.Lock()
	e.nriWatch = true
	e.mu.Unlock()
	return nriMetrics{Metrics: m, e: e}
}

type nriMetrics struct {
	plugin.Metrics
	e *eventsWiring
}

func (n nriMetrics) NRIConnected(up bool) {
	n.Metrics.NRIConnected(up)
	n.e.mu.Lock()
	if up != n.e.nriUp {
		n.e.nriUp, n.e.nriSince = up, time.Now()
	}
	n.e.mu.Unlock()
}

// watchPods returns fetch, also telling e how each read of the kubelet's
// pods went.
func (e *eventsWiring) watchPods(fetch kubeletpods.Fetch) kubeletpods.Fetch {
	if e == nil {
		return fetch
	}
	return func(ctx context.Context) ([]model.KubeletPod, error) {
		pods, err := fetch(ctx)
		e.mu.Lock()
		if err == nil {
			e.podsOK, e.podsErr, e.podsWhy = time.Now(), time.Time{}, ""
		} else if ctx.Err() == nil { // a caller gone is not the kubelet's trouble
			e.podsErr, e.podsWhy = time.Now(), err.Error()
		}
		e.mu.Unlock()
		return pods, err
	}
}

// watchTrouble reports the daemon's trouble on the Node until ctx is done
// (trouble.check), looking every troubleEvery.
func (e *eventsWiring) watchTrouble(ctx context.Context, store *state.Store) {
	tick := time.NewTicker(troubleEvery)
	defer tick.Stop()
	tr := &trouble{e: e, node: e.reporter.Node, writeErrors: store.Stats().WriteErrors}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			tr.check(now, store.Stats())
		}
	}
}

// trouble is what watchTrouble reported: each trouble once per episode.
type trouble struct {
	e    *eventsWiring
	node func(reason, action, note string) // report.Reporter.Node

	nri, pods, writes bool   // reported, and not over since
	writeErrors       uint64 // the state store's write errors at the last look
}

// check reports, on the Node, the trouble that began since the last look:
// the NRI plugin not registered, or the kubelet's pods unreadable, for
// troubleAfter; state writes failing (s is the store's Stats now).
func (t *trouble) check(now time.Time, s state.Stats) {
	e := t.e
	e.mu.Lock()
	nriDown := e.nriWatch && !e.nriUp && now.Sub(e.nriSince) >= troubleAfter
	nriFor := now.Sub(e.nriSince)
	podsDown := !e.podsErr.IsZero() && now.Sub(e.podsOK) >= troubleAfter
	podsFor, podsWhy := now.Sub(e.podsOK), e.podsWhy
	e.mu.Unlock()

	if nriDown && !t.nri {
		t.node(report.ReasonNRIDisconnected, "Connect NRI", fmt.Sprintf(
			"the NRI plugin has not been registered with the runtime for %s: pods' lifecycle is learned from CRI and the kubelet only (see the daemon's log)",
			nriFor.Round(time.Second)))
	}
	t.nri = nriDown

	if podsDown && !t.pods {
		t.node(report.ReasonKubeletPodsUnreadable, "Read pods", fmt.Sprintf(
			"the kubelet's pods have not been readable for %s: pods the daemon has no record of are answered Unavailable; last error: %s",
			podsFor.Round(time.Second), report.Truncate(podsWhy, report.MaxExcerpt)))
	}
	t.pods = podsDown

	failing := s.WriteErrors > t.writeErrors
	if failing && !t.writes {
		t.node(report.ReasonStateWritesFailing, "Write state", fmt.Sprintf(
			"%d writes of the state directory failed (%d in all), %d records wait to be written: a restart loses what they say (see the daemon's log)",
			s.WriteErrors-t.writeErrors, s.WriteErrors, s.Pending))
	}
	// An episode of failing writes is over once nothing waits.
	t.writes = failing || t.writes && s.Pending > 0
	t.writeErrors = s.WriteErrors
}

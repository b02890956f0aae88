package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/dra"
	"github.com/podres-proxy/podres-proxy/dra/resourceapi"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podsapi"
	"github.com/podres-proxy/podres-proxy/metrics"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
)

// legacyView is the legacy view's folding (docs/dra.md) and the reader of
// the API objects it folds from.
type legacyView struct {
	view   *dra.View
	source *resourceapi.Source
}

// newLegacyView builds the legacy view: pods' extended resource claims
// from the Pods API watch, else from /pods (readPods, see dra.PodClaims),
// and the node's ResourceSlices, DeviceClasses (watched) and claims from
// the API server. All of them are read in the background (run), never by a
// query.
// Each /pods read is counted in dra_pods_reads_total, not as the answers'
// reads of pods (pod_source_reads_total): a node whose kubelet serves the
// Pods API reads /pods only for this.
// Each device it cannot fold is told to unfolded (nil: none).
func newLegacyView(c *serveConfig, podsAPI *podsapi.Source, readPods kubeletpods.Fetch, m *metrics.Metrics, unfolded func(model.PodKey, dra.Unfolded), log logrus.FieldLogger) (*legacyView, error) {
	cfg, err := c.apiConfig(log)
	if err != nil {
		return nil, fmt.Errorf("legacy view: %w", err)
	}
	source, err := resourceapi.New(resourceapi.Options{
		Config: cfg, NodeName: c.nodeName,
		Attributes: resourceapi.Attributes{ID: list(c.draIDAttributes), NUMA: list(c.draNUMAAttributes)},
		Log:        log,
	})
	if err != nil {
		return nil, err
	}
	var watch dra.PodWatch
	if podsAPI != nil {
		watch = podsAPI
	}
	return &legacyView{
		source: source,
		view: dra.NewView(dra.ViewOptions{
			Pods:            dra.PodClaims(watch, kubeletpods.Counted(readPods, m.DRAPodsRead)),
			Facts:           source.Facts,
			Allocation:      source.Allocation,
			DriverResources: c.draDrivers,
			Metrics:         m,
			Unfolded:        unfolded,
			Log:             log,
		}),
	}, nil
}

// run reads the legacy view's facts until ctx is done: it watches the
// node's ResourceSlices and the DeviceClasses, and reads the pods' claims
// its answers lacked.
func (l *legacyView) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return l.source.Run(ctx) })
	g.Go(func() error { return l.view.Run(ctx) })
	return g.Wait()
}

// servesLegacy reports whether a --view serves the legacy view.
func (c *serveConfig) servesLegacy() bool {
	return slices.ContainsFunc(c.views, func(v proxy.ViewSocket) bool { return v.View == merge.Legacy })
}

// checkLegacyView checks the legacy view's flags, once the views are read.
// Its socket is never --socket (proxy.ParseViews): a consumer that reads both
// devices and dynamic_resources there would see DRA devices twice.
func (c *serveConfig) checkLegacyView() error {
	if !c.servesLegacy() {
		return nil
	}
	if c.nodeName == "" {
		return errors.New("--view legacy needs --node-name (or NODE_NAME): only this node's ResourceSlices are read")
	}
	if c.apiServer == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return errors.New("--view legacy needs the API server: not in a cluster and no --api-server")
	}
	var err error
	if c.draDrivers, err = registry.ParseResourceMap(c.draResources); err != nil {
		return fmt.Errorf("--dra-resources: %w", err)
	}
	return nil
}

// list splits a comma-separated flag value.
func list(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

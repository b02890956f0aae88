// Package resourceapi reads what the DRA folding (package dra) needs from
// the API server's resource.k8s.io/v1 objects: this node's ResourceSlices
// (each device's id and NUMA node), the DeviceClasses (which driver's
// devices are allocatable as which extended resource) and, by name, a
// pod's extended resource ResourceClaim (which request got which device).
//
// It is a bounded reader over HTTPS with the daemon's one credentials rule
// (internal/bearer), not a client-go informer: docs/dra.md says why. The
// slices and classes are listed every Interval and on demand (Refresh, at
// most once per MinRefresh), and the last good lists keep answering while
// the API server is away.
package resourceapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/dra"
	"github.com/podres-proxy/podres-proxy/internal/bearer"
)

// Defaults of a Source.
const (
	DefaultInterval   = 60 * time.Second
	DefaultMinRefresh = 10 * time.Second
	DefaultTimeout    = 10 * time.Second
	DefaultTokenFile  = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultCAFile     = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// Bounds on what is read: one page of a list, the pages of one list, one
// claim, and the devices kept. A node's slices hold hundreds of devices.
const (
	maxPage    = 8 << 20
	maxPages   = 64
	maxClaim   = 1 << 20
	maxDevices = 1 << 16
	pageLimit  = "500"
)

// Options configure a Source.
type Options struct {
	// APIServer is the API server's base URL; "" means
	// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
	APIServer string
	// TokenFile and CAFile are the service account's; "" means the
	// defaults. Both are re-read when they change (internal/bearer).
	TokenFile, CAFile string
	// NodeName is this node's name: only its slices are listed.
	NodeName string
	// Attributes name the id and NUMA attributes; zero means
	// DefaultAttributes.
	Attributes Attributes
	// Interval between lists, MinRefresh between on-demand lists, Timeout
	// of one request; 0 means the defaults.
	Interval, MinRefresh, Timeout time.Duration
	Log                           logrus.FieldLogger
}

// Source reads ResourceSlices, DeviceClasses and ResourceClaims.
type Source struct {
	opts   Options
	server string
	http   *bearer.Client
	log    logrus.FieldLogger

	state   atomic.Pointer[state]
	refresh chan struct{}
}

// state is what the last good lists said.
type state struct {
	devices map[dra.DeviceRef]dra.Device
	classes map[string]string // driver: extended resource
}

// New returns a source; nothing is read until Run.
func New(opts Options) (*Source, error) {
	if opts.NodeName == "" {
		return nil, errors.New("DRA source: the node name is required (set NODE_NAME from spec.nodeName)")
	}
	server, err := bearer.APIServer(opts.APIServer)
	if err != nil {
		return nil, fmt.Errorf("DRA source: %w", err)
	}
	opts.TokenFile = cmp.Or(opts.TokenFile, DefaultTokenFile)
	opts.CAFile = cmp.Or(opts.CAFile, DefaultCAFile)
	opts.Interval = cmp.Or(opts.Interval, DefaultInterval)
	opts.MinRefresh = cmp.Or(opts.MinRefresh, DefaultMinRefresh)
	opts.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	if len(opts.Attributes.ID) == 0 && len(opts.Attributes.NUMA) == 0 {
		opts.Attributes = DefaultAttributes
	}
	client, err := bearer.New(bearer.Config{What: "API server", TokenFile: opts.TokenFile, CAFile: opts.CAFile, Proxy: http.ProxyFromEnvironment})
	if err != nil {
		return nil, fmt.Errorf("DRA source: %w", err)
	}
	s := &Source{
		opts:    opts,
		server:  strings.TrimSuffix(server, "/"),
		http:    client,
		log:     cmp.Or[logrus.FieldLogger](opts.Log, logrus.StandardLogger()),
		refresh: make(chan struct{}, 1),
	}
	s.state.Store(&state{})
	return s, nil
}

// Facts returns what the last good lists said: the node's devices and the
// classes' extended resources. It never waits.
func (s *Source) Facts() dra.Facts {
	st := s.state.Load()
	return dra.Facts{Devices: st.devices, ClassResources: st.classes}
}

// Refresh asks for a list soon (a device the kubelet reported is in no
// slice read yet); it never waits.
func (s *Source) Refresh() {
	select {
	case s.refresh <- struct{}{}:
	default:
	}
}

// Run lists every Interval and on Refresh (at most once per MinRefresh)
// until ctx is done; Load lists first. A failed list is logged and keeps
// the last good one.
func (s *Source) Run(ctx context.Context) error {
	tick := time.NewTicker(s.opts.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-s.refresh:
		}
		if err := s.Load(ctx); err != nil && ctx.Err() == nil {
			s.log.WithError(err).Warn("DRA: listing ResourceSlices and DeviceClasses failed; the last lists keep answering")
		}
		wait := time.NewTimer(s.opts.MinRefresh)
		select {
		case <-ctx.Done():
			wait.Stop()
			return nil
		case <-wait.C:
		}
	}
}

// Load lists the slices and the classes now, and keeps them if both were
// read: serve calls it before serving the legacy view, since NFD asks
// GetAllocatableResources once, at its start.
func (s *Source) Load(ctx context.Context) error {
	pools := map[[2]string]*pool{}
	q := url.Values{"fieldSelector": {"spec.nodeName=" + s.opts.NodeName}}
	err := s.list(ctx, "/apis/resource.k8s.io/v1/resourceslices", q, "resourceslices", func(body []byte) (string, error) {
		return decodeSlices(body, s.opts.NodeName, s.opts.Attributes, pools)
	})
	if err != nil {
		return err
	}
	var classes []deviceClass
	err = s.list(ctx, "/apis/resource.k8s.io/v1/deviceclasses", url.Values{}, "deviceclasses", func(body []byte) (string, error) {
		return decodeClasses(body, &classes)
	})
	if err != nil {
		return err
	}
	devices := map[dra.DeviceRef]dra.Device{}
	for _, p := range pools {
		for ref, d := range p.devices {
			if len(devices) == maxDevices {
				return fmt.Errorf("node %s's ResourceSlices list more than %d devices", s.opts.NodeName, maxDevices)
			}
			devices[ref] = d
		}
	}
	resources, skipped := classResources(classes)
	if len(skipped) > 0 {
		s.log.WithField("classes", skipped).Debug("DRA: DeviceClasses with an extended resource name whose selectors are not all device.driver == \"...\": their devices are folded when allocated but not listed as allocatable")
	}
	s.state.Store(&state{devices: devices, classes: resources})
	return nil
}

// list reads every page of a list, handing each to page.
func (s *Source) list(ctx context.Context, path string, q url.Values, resource string, page func([]byte) (string, error)) error {
	q.Set("limit", pageLimit)
	for range maxPages {
		body, err := s.get(ctx, path+"?"+q.Encode(), resource, "list", maxPage)
		if err != nil {
			return err
		}
		next, err := page(body)
		if err != nil {
			return err
		}
		if next == "" {
			return nil
		}
		q.Set("continue", next)
	}
	return fmt.Errorf("listing %s: more than %d pages", resource, maxPages)
}

// Allocation reads the ResourceClaim namespace/name's allocation.
func (s *Source) Allocation(ctx context.Context, namespace, name string) (dra.Allocation, error) {
	path := "/apis/resource.k8s.io/v1/namespaces/" + url.PathEscape(namespace) + "/resourceclaims/" + url.PathEscape(name)
	body, err := s.get(ctx, path, "resourceclaims", "get", maxClaim)
	if err != nil {
		return nil, err
	}
	alloc, err := decodeClaim(body, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("ResourceClaim %s/%s: %w", namespace, name, err)
	}
	return alloc, nil
}

// get does one bounded GET. A 403 names the RBAC rule missing.
func (s *Source) get(ctx context.Context, path, resource, verb string, limit int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	resp, body, err := s.http.GetAll(ctx, s.server+path, limit)
	if errors.Is(err, bearer.ErrTooLarge) {
		return nil, fmt.Errorf("%s %s: the answer is larger than %d bytes", verb, resource, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", verb, resource, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return body, nil
	case http.StatusForbidden:
		return nil, fmt.Errorf("%s %s: 403 Forbidden: the service account lacks the RBAC rule {apiGroups: [\"resource.k8s.io\"], resources: [%q], verbs: [%q]} (deploy/components/dra-legacy-view)", verb, resource, resource, verb)
	default:
		msg := string(body)
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		return nil, fmt.Errorf("%s %s: %s: %s", verb, resource, resp.Status, msg)
	}
}

// Package devicecr is the inventory source that reads Koordinator's Device
// object named after the node (scheduling.koordinator.sh/v1alpha1,
// cluster-scoped) from the API server over HTTPS with the service account's
// token. It is the source of highest precedence: the scheduler allocated
// from it, so its ids are the ids in the pods' annotations.
package devicecr

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/podres-proxy/podres-proxy/internal/bearer"
	"github.com/podres-proxy/podres-proxy/inventory"
)

// Defaults of the Device object source: the in-cluster service account.
const (
	DefaultInterval  = 60 * time.Second
	DefaultTimeout   = 10 * time.Second
	DefaultTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// maxDeviceCRSize bounds the Device object read: a node's devices with all
// their VFs take tens of KiB.
const maxDeviceCRSize = 8 << 20

// gpuVendorLabel is the Device object label koordlet sets to the GPUs'
// vendor.
const gpuVendorLabel = "node.koordinator.sh/gpu-vendor"

// Options configure a Source.
type Options struct {
	// APIServer is the API server's base URL; "" means
	// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
	APIServer string
	// TokenFile holds the bearer token; "" means DefaultTokenFile. It is
	// re-read when it changes (see internal/bearer), so a rotated token is
	// used at once.
	TokenFile string
	// CAFile holds the CA bundle the API server's certificate is verified
	// with; "" means DefaultCAFile. It is reread when it changes.
	CAFile string
	// NodeName is this node's name, which the Device object is named after.
	NodeName string
	// Interval between reads; 0 means DefaultInterval.
	Interval time.Duration
	// Timeout of one read; 0 means DefaultTimeout.
	Timeout time.Duration
}

// Source reads Koordinator's Device object named after the node
// (scheduling.koordinator.sh/v1alpha1, cluster-scoped) from the API server.
// It decodes only what the inventory needs: spec.devices[] type, id, minor,
// health, topology.nodeID, topology.busID and vfGroups[].vfs[].busID, and
// the GPU vendor label. A missing object means no devices; a 403 names the
// RBAC rule the service account lacks.
type Source struct {
	opts Options
	url  string

	// Made at the first Load, so that a missing CA file is a failed read
	// (logged; the other sources keep serving), not a failed start.
	// Guarded by the Inventory's per-source serialization of Load.
	http *bearer.Client
}

// New returns a source for the Device object of opts.NodeName.
func New(opts Options) (*Source, error) {
	if opts.NodeName == "" {
		return nil, errors.New("device-cr source: the node name is required (set NODE_NAME from spec.nodeName)")
	}
	server, err := bearer.APIServer(opts.APIServer)
	if err != nil {
		return nil, fmt.Errorf("device-cr source: %w", err)
	}
	opts.TokenFile = cmp.Or(opts.TokenFile, DefaultTokenFile)
	opts.CAFile = cmp.Or(opts.CAFile, DefaultCAFile)
	opts.Interval = cmp.Or(opts.Interval, DefaultInterval)
	opts.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	path := "/apis/scheduling.koordinator.sh/v1alpha1/devices/" + url.PathEscape(opts.NodeName)
	return &Source{opts: opts, url: strings.TrimSuffix(server, "/") + path}, nil
}

// Name implements inventory.Source.
func (s *Source) Name() string { return inventory.SourceDeviceCR }

// Interval implements inventory.Source.
func (s *Source) Interval() time.Duration { return s.opts.Interval }

// Load implements inventory.Source: one GET of the Device object.
func (s *Source) Load(ctx context.Context) ([]inventory.Device, error) {
	if s.http == nil {
		client, err := bearer.New(bearer.Config{What: "API server", TokenFile: s.opts.TokenFile, CAFile: s.opts.CAFile, Proxy: http.ProxyFromEnvironment})
		if err != nil {
			return nil, err
		}
		s.http = client
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	resp, body, err := s.http.GetAll(ctx, s.url, maxDeviceCRSize)
	if errors.Is(err, bearer.ErrTooLarge) {
		return nil, fmt.Errorf("the Device object %s from %s is larger than %d bytes", s.opts.NodeName, s.url, maxDeviceCRSize)
	}
	if err != nil {
		return nil, fmt.Errorf("getting Device %s: %w", s.opts.NodeName, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		devices, err := decodeDeviceCR(body, s.opts.NodeName)
		if err != nil {
			return nil, fmt.Errorf("decoding Device %s: %w", s.opts.NodeName, err)
		}
		return devices, nil
	case http.StatusNotFound:
		return nil, fmt.Errorf("the Device object %s (scheduling.koordinator.sh/v1alpha1) was not found: koordlet has not reported this node's devices, or Koordinator is not installed%s: %w",
			s.opts.NodeName, apiMessage(body), inventory.ErrAbsent)
	case http.StatusUnauthorized:
		return nil, fmt.Errorf("getting Device %s: 401 Unauthorized: the API server rejected the token in %s%s", s.opts.NodeName, s.opts.TokenFile, apiMessage(body))
	case http.StatusForbidden:
		return nil, fmt.Errorf("getting Device %s: 403 Forbidden: the service account lacks RBAC permission to get devices.scheduling.koordinator.sh; "+
			"add to its ClusterRole the rule {apiGroups: [\"scheduling.koordinator.sh\"], resources: [\"devices\"], verbs: [\"get\"]}%s", s.opts.NodeName, apiMessage(body))
	default:
		return nil, fmt.Errorf("getting Device %s from %s: unexpected status %s%s", s.opts.NodeName, s.url, resp.Status, apiMessage(body))
	}
}

// apiMessage extracts a Status object's message from an error answer, so
// that the log says what the API server said.
func apiMessage(body []byte) string {
	var status struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &status) != nil || status.Kind != "Status" || status.Message == "" {
		return ""
	}
	msg := status.Message
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	return " (API server: " + msg + ")"
}

// deviceObject is the part of a Koordinator Device object the inventory
// reads; the rest is ignored.
type deviceObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Devices []struct {
			Type     string `json:"type"`
			ID       string `json:"id"`
			Minor    *int64 `json:"minor"`
			Health   bool   `json:"health"`
			Topology *struct {
				NodeID *int64 `json:"nodeID"`
				BusID  string `json:"busID"`
			} `json:"topology"`
			VFGroups []struct {
				VFs []struct {
					BusID string `json:"busID"`
				} `json:"vfs"`
			} `json:"vfGroups"`
		} `json:"devices"`
	} `json:"spec"`
}

// decodeDeviceCR decodes a Device object. Devices without id or bus address
// cannot be matched with anything and are skipped, as are VFs without a
// valid address; an object for another node is an error.
func decodeDeviceCR(body []byte, node string) ([]inventory.Device, error) {
	var obj deviceObject
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, err
	}
	if obj.Kind != "" && obj.Kind != "Device" {
		return nil, fmt.Errorf("got a %s, not a Device", obj.Kind)
	}
	if obj.Metadata.Name != "" && obj.Metadata.Name != node {
		return nil, fmt.Errorf("got the Device of node %q, not %q", obj.Metadata.Name, node)
	}
	vendor := strings.ToLower(obj.Metadata.Labels[gpuVendorLabel])
	var devices []inventory.Device
	for _, cd := range obj.Spec.Devices {
		d := inventory.Device{Type: cd.Type, ID: cd.ID, Minor: inventory.Known(cd.Minor), Healthy: cd.Health}
		if c, ok := inventory.CanonicalPCIAddress(cd.ID); ok {
			d.ID = c
		}
		if cd.Topology != nil {
			d.NUMANode = inventory.Known(cd.Topology.NodeID)
			d.BusID, _ = inventory.CanonicalPCIAddress(cd.Topology.BusID)
		}
		if d.BusID == "" {
			d.BusID, _ = inventory.CanonicalPCIAddress(d.ID)
		}
		if d.ID == "" && d.BusID == "" {
			continue
		}
		if d.Type == inventory.TypeGPU {
			d.Vendor = vendor
		}
		for _, g := range cd.VFGroups {
			for _, vf := range g.VFs {
				if c, ok := inventory.CanonicalPCIAddress(vf.BusID); ok {
					d.VFs = append(d.VFs, inventory.VF{BusID: c})
				}
			}
		}
		devices = append(devices, d)
	}
	return devices, nil
}

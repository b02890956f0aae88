// Package devicecr is the inventory source that keeps Koordinator's Device
// object named after the node (scheduling.koordinator.sh/v1alpha1,
// cluster-scoped) by a watch on the API server (internal/informer, with the
// dynamic client: the object's Go types are Koordinator's). It is the
// source of highest precedence: the scheduler allocated from it, so its ids
// are the ids in the pods' annotations.
package devicecr

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/internal/informer"
	"github.com/podres-proxy/podres-proxy/inventory"
)

// DefaultTimeout bounds Load's wait for the first list.
const DefaultTimeout = 10 * time.Second

// maxDeviceCRSize bounds each answer of the API server: the list of the one
// object, and each watch (it is ended there and resumed). A node's devices
// with all their VFs take tens of KiB.
const maxDeviceCRSize = 8 << 20

// gpuVendorLabel is the Device object label koordlet sets to the GPUs'
// vendor.
const gpuVendorLabel = "node.koordinator.sh/gpu-vendor"

// Resource is the Device object's resource.
var Resource = schema.GroupVersionResource{Group: "scheduling.koordinator.sh", Version: "v1alpha1", Resource: "devices"}

// Options configure a Source.
type Options struct {
	// Config is the API server's (internal/apiclient).
	Config *rest.Config
	// NodeName is this node's name, which the Device object is named after.
	NodeName string
	// Timeout bounds Load's wait for the first list; 0 means
	// DefaultTimeout.
	Timeout time.Duration
}

// Source keeps Koordinator's Device object named after the node. It
// decodes only what the inventory needs: spec.devices[] type, id, minor,
// health, topology.nodeID, topology.busID and vfGroups[].vfs[].busID, and
// the GPU vendor label; the rest is dropped as it arrives. A missing object
// (or a cluster without the resource) means no devices; a 403 names the
// RBAC rule the service account lacks.
type Source struct {
	opts Options
	inf  *informer.Informer
}

// New returns a source for the Device object of opts.NodeName; Run keeps it.
func New(opts Options) (*Source, error) {
	if opts.NodeName == "" {
		return nil, errors.New("device-cr source: the node name is required (set NODE_NAME from spec.nodeName)")
	}
	if opts.Config == nil {
		return nil, errors.New("device-cr source: no API server configuration")
	}
	opts.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	client, err := dynamic.NewForConfig(apiclient.Bounded(opts.Config, maxDeviceCRSize, maxDeviceCRSize))
	if err != nil {
		return nil, fmt.Errorf("device-cr source: %w", err)
	}
	list, watch := informer.ListWatch(client.Resource(Resource), "metadata.name="+opts.NodeName)
	node := opts.NodeName
	s := &Source{opts: opts}
	s.inf = informer.New(informer.Options{
		List:      list,
		Watch:     watch,
		Object:    &unstructured.Unstructured{},
		Transform: func(obj any) (any, error) { return transform(obj, node), nil },
		MaxPages:  1, // one object: the field selector names it
	})
	return s, nil
}

// decoded is what is kept of a Device object: its devices, or why they
// could not be read.
type decoded struct {
	metav1.ObjectMeta
	devices []inventory.Device
	err     error
}

// transform decodes a Device object as it arrives; anything else (a
// decoded object, a deletion's last state) passes.
func transform(obj any, node string) any {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj
	}
	d := &decoded{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), ResourceVersion: u.GetResourceVersion()}}
	body, err := json.Marshal(u.Object)
	if err == nil {
		d.devices, err = decodeDeviceCR(body, node)
	}
	if err != nil {
		d.err = fmt.Errorf("decoding Device %s: %w", node, err)
	}
	return d
}

// Run watches the Device object until ctx is done.
func (s *Source) Run(ctx context.Context) error { return s.inf.Run(ctx) }

// Name implements inventory.Source.
func (s *Source) Name() string { return inventory.SourceDeviceCR }

// Interval implements inventory.Source: 0, the watch says when the object
// changed (Changed).
func (s *Source) Interval() time.Duration { return 0 }

// Changed implements inventory.Notifier.
func (s *Source) Changed() <-chan struct{} { return s.inf.Changed() }

// Load implements inventory.Source: the object the watch keeps, once the
// first list is in (waiting at most Timeout for it).
func (s *Source) Load(ctx context.Context) ([]inventory.Device, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	if err := s.inf.Wait(ctx); err != nil {
		return nil, s.explain(err)
	}
	if err := s.inf.Err(); err != nil {
		return nil, s.explain(err)
	}
	for _, obj := range s.inf.Objects() {
		d, ok := obj.(*decoded)
		if !ok || d.Name != s.opts.NodeName {
			continue // another node's: the list asked for this node's only
		}
		if d.err != nil {
			return nil, d.err
		}
		out := make([]inventory.Device, len(d.devices))
		copy(out, d.devices)
		return out, nil
	}
	return nil, fmt.Errorf("the Device object %s (scheduling.koordinator.sh/v1alpha1) was not found: koordlet has not reported this node's devices: %w", s.opts.NodeName, inventory.ErrAbsent)
}

// explain says what a failed list means for the inventory.
func (s *Source) explain(err error) error {
	node := s.opts.NodeName
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("the Device objects (scheduling.koordinator.sh/v1alpha1) are not served: Koordinator is not installed (API server: %s): %w", short(err), inventory.ErrAbsent)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("watching Device %s: 401 Unauthorized: the API server rejected the token (API server: %s)", node, short(err))
	case apierrors.IsForbidden(err):
		return fmt.Errorf("watching Device %s: 403 Forbidden: the service account lacks RBAC permission to list and watch devices.scheduling.koordinator.sh; "+
			"add to its ClusterRole the rule {apiGroups: [\"scheduling.koordinator.sh\"], resources: [\"devices\"], verbs: [\"list\", \"watch\"]} (API server: %s)", node, short(err))
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("watching Device %s: no list within %s", node, s.opts.Timeout)
	default:
		return fmt.Errorf("watching Device %s: %w", node, err)
	}
}

// short bounds an API server's message in a log line.
func short(err error) string {
	msg := err.Error()
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	return msg
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

var _ inventory.Notifier = (*Source)(nil)

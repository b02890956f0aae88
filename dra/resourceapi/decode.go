package resourceapi

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/podres-proxy/podres-proxy/dra"
	"github.com/podres-proxy/podres-proxy/inventory"
)

// Attributes say which ResourceSlice device attributes give a device's id
// and NUMA node, each list in order of preference. A name without a
// domain is in the device's driver's domain, as in DRA's CEL: "uuid"
// matches the attribute "uuid" and "<driver>/uuid".
type Attributes struct {
	ID   []string
	NUMA []string
}

// DefaultAttributes are the attributes GPU and NIC drivers publish: a
// driver's own "uuid" (GPUs) before the standard PCI address (VFs, and
// GPUs of drivers without a uuid), and a driver's "numaNode".
var DefaultAttributes = Attributes{
	ID:   []string{"uuid", "resource.kubernetes.io/pciBusID"},
	NUMA: []string{"numaNode"},
}

// listPage is one page of a list answer: its items, and where the next
// page starts.
type listPage[T any] struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Continue string `json:"continue"`
	} `json:"metadata"`
	Items []T `json:"items"`
}

// slice is the part of a resource.k8s.io/v1 ResourceSlice the folding
// reads.
type slice struct {
	Spec struct {
		Driver string `json:"driver"`
		Pool   struct {
			Name       string `json:"name"`
			Generation int64  `json:"generation"`
		} `json:"pool"`
		NodeName *string `json:"nodeName"`
		Devices  []struct {
			Name       string               `json:"name"`
			Attributes map[string]attribute `json:"attributes"`
		} `json:"devices"`
	} `json:"spec"`
}

// attribute is a DeviceAttribute: exactly one of its fields is set.
type attribute struct {
	Int    *int64  `json:"int"`
	String *string `json:"string"`
}

// pool is the devices of one pool's newest generation.
type pool struct {
	generation int64
	devices    map[dra.DeviceRef]dra.Device
}

// decodeSlices adds the devices of one page of a ResourceSliceList to
// pools, keeping each pool's newest generation only (a driver republishing
// a pool leaves slices of the old one until it deletes them). It checks
// that every slice is node's: the list asked for node's only.
func decodeSlices(body []byte, node string, attrs Attributes, pools map[[2]string]*pool) (next string, err error) {
	var page listPage[slice]
	if err := json.Unmarshal(body, &page); err != nil {
		return "", fmt.Errorf("decode ResourceSliceList: %w", err)
	}
	if page.Kind != "ResourceSliceList" {
		return "", fmt.Errorf("decode ResourceSliceList: got kind %q", page.Kind)
	}
	for i := range page.Items {
		s := &page.Items[i].Spec
		if s.NodeName == nil || *s.NodeName != node {
			return "", fmt.Errorf("decode ResourceSliceList: a slice of driver %q is not node %s's", s.Driver, node)
		}
		if s.Driver == "" || s.Pool.Name == "" {
			continue
		}
		key := [2]string{s.Driver, s.Pool.Name}
		p := pools[key]
		switch {
		case p == nil || s.Pool.Generation > p.generation:
			p = &pool{generation: s.Pool.Generation, devices: map[dra.DeviceRef]dra.Device{}}
			pools[key] = p
		case s.Pool.Generation < p.generation:
			continue
		}
		for _, d := range s.Devices {
			if d.Name == "" {
				continue
			}
			ref := dra.DeviceRef{Driver: s.Driver, Pool: s.Pool.Name, Device: d.Name}
			p.devices[ref] = device(s.Driver, d.Attributes, attrs)
		}
	}
	return page.Metadata.Continue, nil
}

// device reads a device's id and NUMA node from its attributes. A PCI
// address is written as consumers match it (lower case, with its domain).
func device(driver string, attrs map[string]attribute, want Attributes) dra.Device {
	d := dra.Device{NUMANode: -1}
	for _, name := range want.ID {
		if a, ok := lookup(driver, attrs, name); ok && a.String != nil && *a.String != "" {
			d.ID = *a.String
			if c, ok := inventory.CanonicalPCIAddress(d.ID); ok && strings.Contains(d.ID, ":") {
				d.ID = c
			}
			break
		}
	}
	for _, name := range want.NUMA {
		if a, ok := lookup(driver, attrs, name); ok && a.Int != nil && *a.Int >= 0 {
			d.NUMANode = *a.Int
			break
		}
	}
	return d
}

// lookup finds the attribute name, which without a domain is the
// driver's.
func lookup(driver string, attrs map[string]attribute, name string) (attribute, bool) {
	if a, ok := attrs[name]; ok {
		return a, true
	}
	if !strings.Contains(name, "/") {
		a, ok := attrs[driver+"/"+name]
		return a, ok
	}
	return attribute{}, false
}

// class is the part of a DeviceClass the folding reads.
type class struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		ExtendedResourceName string `json:"extendedResourceName"`
		Selectors            []struct {
			CEL *struct {
				Expression string `json:"expression"`
			} `json:"cel"`
		} `json:"selectors"`
	} `json:"spec"`
}

// decodeClasses appends one page of a DeviceClassList to classes.
func decodeClasses(body []byte, classes *[]deviceClass) (next string, err error) {
	var page listPage[class]
	if err := json.Unmarshal(body, &page); err != nil {
		return "", fmt.Errorf("decode DeviceClassList: %w", err)
	}
	if page.Kind != "DeviceClassList" {
		return "", fmt.Errorf("decode DeviceClassList: got kind %q", page.Kind)
	}
	for _, c := range page.Items {
		dc := deviceClass{Name: c.Metadata.Name, ExtendedResourceName: c.Spec.ExtendedResourceName}
		for _, s := range c.Spec.Selectors {
			if s.CEL == nil {
				dc.Selectors = append(dc.Selectors, "") // a selector kind this reader does not know: never a driver selector
				continue
			}
			dc.Selectors = append(dc.Selectors, s.CEL.Expression)
		}
		*classes = append(*classes, dc)
	}
	return page.Metadata.Continue, nil
}

// claim is the part of a ResourceClaim the folding reads.
type claim struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"metadata"`
	Status struct {
		Allocation *struct {
			Devices struct {
				Results []struct {
					Request string `json:"request"`
					Driver  string `json:"driver"`
					Pool    string `json:"pool"`
					Device  string `json:"device"`
				} `json:"results"`
			} `json:"devices"`
		} `json:"allocation"`
	} `json:"status"`
}

// errNotAllocated is the error of a claim without an allocation.
var errNotAllocated = fmt.Errorf("the claim is not allocated")

// decodeClaim reads a ResourceClaim's allocation: the devices of each
// request (a subrequest's "request/sub" counts as its request's).
func decodeClaim(body []byte, namespace, name string) (dra.Allocation, error) {
	var c claim
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, fmt.Errorf("decode ResourceClaim: %w", err)
	}
	if c.Kind != "ResourceClaim" || c.Metadata.Namespace != namespace || c.Metadata.Name != name {
		return nil, fmt.Errorf("decode ResourceClaim: got %s %s/%s, not ResourceClaim %s/%s", c.Kind, c.Metadata.Namespace, c.Metadata.Name, namespace, name)
	}
	if c.Status.Allocation == nil {
		return nil, errNotAllocated
	}
	alloc := dra.Allocation{}
	for _, r := range c.Status.Allocation.Devices.Results {
		req, _, _ := strings.Cut(r.Request, "/")
		alloc[req] = append(alloc[req], dra.DeviceRef{Driver: r.Driver, Pool: r.Pool, Device: r.Device})
	}
	return alloc, nil
}

package resourceapi

import (
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// trimSlice returns what is kept of a ResourceSlice: its name, driver,
// pool and node, and of its first maxSliceDevices devices (the API's own
// bound) the name and the attributes attrs name; the rest is dropped as it
// arrives. dropped counts the devices past the bound.
func trimSlice(s *resourcev1.ResourceSlice, attrs Attributes) (kept *resourcev1.ResourceSlice, dropped int) {
	kept = &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, ResourceVersion: s.ResourceVersion},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   s.Spec.Driver,
			Pool:     resourcev1.ResourcePool{Name: s.Spec.Pool.Name, Generation: s.Spec.Pool.Generation},
			NodeName: s.Spec.NodeName,
		},
	}
	devices := s.Spec.Devices
	if len(devices) > maxSliceDevices {
		dropped = len(devices) - maxSliceDevices
		devices = devices[:maxSliceDevices]
	}
	kept.Spec.Devices = make([]resourcev1.Device, 0, len(devices))
	for _, d := range devices {
		k := resourcev1.Device{Name: d.Name}
		for _, name := range append(append([]string(nil), attrs.ID...), attrs.NUMA...) {
			for _, q := range []string{name, s.Spec.Driver + "/" + name} {
				if a, ok := d.Attributes[resourcev1.QualifiedName(q)]; ok {
					if k.Attributes == nil {
						k.Attributes = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}
					}
					k.Attributes[resourcev1.QualifiedName(q)] = resourcev1.DeviceAttribute{IntValue: a.IntValue, StringValue: a.StringValue}
				}
			}
		}
		kept.Spec.Devices = append(kept.Spec.Devices, k)
	}
	return kept, dropped
}

// nodeDevices reads the devices of node's slices, keeping each pool's
// newest generation only (a driver republishing a pool leaves slices of the
// old one until it deletes them), at most max of them: dropped counts the
// rest. A slice of another node is skipped: the watch asked for node's.
func nodeDevices(slices []*resourcev1.ResourceSlice, node string, attrs Attributes, max int) (devices map[dra.DeviceRef]dra.Device, dropped int) {
	type pool struct {
		generation int64
		slices     []*resourcev1.ResourceSlice
	}
	pools := map[[2]string]*pool{}
	for _, s := range slices {
		if s.Spec.NodeName == nil || *s.Spec.NodeName != node || s.Spec.Driver == "" || s.Spec.Pool.Name == "" {
			continue
		}
		key := [2]string{s.Spec.Driver, s.Spec.Pool.Name}
		p := pools[key]
		switch {
		case p == nil || s.Spec.Pool.Generation > p.generation:
			p = &pool{generation: s.Spec.Pool.Generation}
			pools[key] = p
		case s.Spec.Pool.Generation < p.generation:
			continue
		}
		p.slices = append(p.slices, s)
	}
	devices = map[dra.DeviceRef]dra.Device{}
	for key, p := range pools {
		for _, s := range p.slices {
			for _, d := range s.Spec.Devices {
				if d.Name == "" {
					continue
				}
				ref := dra.DeviceRef{Driver: key[0], Pool: key[1], Device: d.Name}
				if _, seen := devices[ref]; !seen && len(devices) == max {
					dropped++
					continue
				}
				devices[ref] = device(key[0], d.Attributes, attrs)
			}
		}
	}
	return devices, dropped
}

// device reads a device's id and NUMA node from its attributes. A PCI
// address is written as consumers match it (lower case, with its domain).
func device(driver string, attrs map[resourcev1.QualifiedName]resourcev1.DeviceAttribute, want Attributes) dra.Device {
	d := dra.Device{NUMANode: -1}
	for _, name := range want.ID {
		if a, ok := lookup(driver, attrs, name); ok && a.StringValue != nil && *a.StringValue != "" {
			d.ID = *a.StringValue
			if c, ok := inventory.CanonicalPCIAddress(d.ID); ok && strings.Contains(d.ID, ":") {
				d.ID = c
			}
			break
		}
	}
	for _, name := range want.NUMA {
		if a, ok := lookup(driver, attrs, name); ok && a.IntValue != nil && *a.IntValue >= 0 {
			d.NUMANode = *a.IntValue
			break
		}
	}
	return d
}

// lookup finds the attribute name, which without a domain is the
// driver's.
func lookup(driver string, attrs map[resourcev1.QualifiedName]resourcev1.DeviceAttribute, name string) (resourcev1.DeviceAttribute, bool) {
	if a, ok := attrs[resourcev1.QualifiedName(name)]; ok {
		return a, true
	}
	if !strings.Contains(name, "/") {
		a, ok := attrs[resourcev1.QualifiedName(driver+"/"+name)]
		return a, ok
	}
	return resourcev1.DeviceAttribute{}, false
}

// trimClass returns what is kept of a DeviceClass: its name, extended
// resource name and CEL selectors.
func trimClass(c *resourcev1.DeviceClass) *resourcev1.DeviceClass {
	kept := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, ResourceVersion: c.ResourceVersion},
		Spec:       resourcev1.DeviceClassSpec{ExtendedResourceName: c.Spec.ExtendedResourceName},
	}
	for _, s := range c.Spec.Selectors {
		var k resourcev1.DeviceSelector
		if s.CEL != nil {
			k.CEL = &resourcev1.CELDeviceSelector{Expression: s.CEL.Expression}
		}
		kept.Spec.Selectors = append(kept.Spec.Selectors, k)
	}
	return kept
}

// classOf is what the folding reads of a DeviceClass.
func classOf(c *resourcev1.DeviceClass) deviceClass {
	dc := deviceClass{Name: c.Name}
	if c.Spec.ExtendedResourceName != nil {
		dc.ExtendedResourceName = *c.Spec.ExtendedResourceName
	}
	for _, s := range c.Spec.Selectors {
		if s.CEL == nil {
			dc.Selectors = append(dc.Selectors, "") // a selector kind this reader does not know: never a driver selector
			continue
		}
		dc.Selectors = append(dc.Selectors, s.CEL.Expression)
	}
	return dc
}

// allocationOf reads a ResourceClaim's allocation: the devices of each
// request (a subrequest's "request/sub" counts as its request's); ok is
// false when the claim is not allocated.
func allocationOf(c *resourcev1.ResourceClaim) (alloc dra.Allocation, ok bool) {
	if c.Status.Allocation == nil {
		return nil, false
	}
	alloc = dra.Allocation{}
	for _, r := range c.Status.Allocation.Devices.Results {
		req, _, _ := strings.Cut(r.Request, "/")
		alloc[req] = append(alloc[req], dra.DeviceRef{Driver: r.Driver, Pool: r.Pool, Device: r.Device})
	}
	return alloc, true
}

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

// slice is what is kept of a ResourceSlice: its name (the store's key),
// driver, pool and node, and each device's name, id and NUMA node.
type slice struct {
	metav1.ObjectMeta
	driver, pool, node string
	generation         int64
	devices            []sliceDevice
}

type sliceDevice struct {
	name   string
	device dra.Device
}

// trimSlice returns what is kept of a ResourceSlice: of its first
// maxSliceDevices devices (the API's own bound) the name, and the id and
// NUMA node attrs say; the rest is dropped as it arrives. dropped counts
// the devices past the bound.
func trimSlice(s *resourcev1.ResourceSlice, attrs Attributes) (kept *slice, dropped int) {
	kept = &slice{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, ResourceVersion: s.ResourceVersion},
		driver:     s.Spec.Driver,
		pool:       s.Spec.Pool.Name,
		generation: s.Spec.Pool.Generation,
	}
	if s.Spec.NodeName != nil {
		kept.node = *s.Spec.NodeName
	}
	devices := s.Spec.Devices
	if len(devices) > maxSliceDevices {
		dropped = len(devices) - maxSliceDevices
		devices = devices[:maxSliceDevices]
	}
	kept.devices = make([]sliceDevice, 0, len(devices))
	for _, d := range devices {
		if d.Name == "" {
			continue
		}
		kept.devices = append(kept.devices, sliceDevice{name: d.Name, device: device(s.Spec.Driver, d.Attributes, attrs)})
	}
	return kept, dropped
}

// nodeDevices reads the devices of node's slices, keeping each pool's
// newest generation only (a driver republishing a pool leaves slices of the
// old one until it deletes them), at most max of them: dropped counts the
// rest. A slice of another node is skipped: the watch asked for node's.
func nodeDevices(slices []*slice, node string, max int) (devices map[dra.DeviceRef]dra.Device, dropped int) {
	type pool struct {
		generation int64
		slices     []*slice
	}
	pools := map[[2]string]*pool{}
	for _, s := range slices {
		if s.node != node || s.driver == "" || s.pool == "" {
			continue
		}
		key := [2]string{s.driver, s.pool}
		p := pools[key]
		switch {
		case p == nil || s.generation > p.generation:
			p = &pool{generation: s.generation}
			pools[key] = p
		case s.generation < p.generation:
			continue
		}
		p.slices = append(p.slices, s)
	}
	devices = map[dra.DeviceRef]dra.Device{}
	for key, p := range pools {
		for _, s := range p.slices {
			for _, d := range s.devices {
				ref := dra.DeviceRef{Driver: key[0], Pool: key[1], Device: d.name}
				if _, seen := devices[ref]; !seen && len(devices) == max {
					dropped++
					continue
				}
				devices[ref] = d.device
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

package resourceapi

import "regexp"

// deviceClass is what the folding reads of a resource.k8s.io/v1
// deviceClass: its extended resource name and its CEL selectors.
type deviceClass struct {
	Name                 string
	ExtendedResourceName string
	Selectors            []string
}

// driverSelector is the one CEL selector the folding understands: the
// class selects every device of one driver, the shape DRA drivers' own
// classes have (device.driver == "gpu.example.com").
var driverSelector = regexp.MustCompile(`^\s*device\.driver\s*==\s*(?:"([^"\\]+)"|'([^'\\]+)')\s*$`)

// classResource returns the driver whose devices class makes allocatable as
// its extended resource: the class names an extended resource and each of
// its selectors is `device.driver == "<driver>"` for one driver. Any other
// selector would need DRA's CEL environment to tell which devices it
// selects, so such a class lists nothing (ok false): its devices are still
// folded when allocated, since the pod's status names their resource.
func classResource(class deviceClass) (driver string, ok bool) {
	if class.ExtendedResourceName == "" || len(class.Selectors) == 0 {
		return "", false
	}
	for _, sel := range class.Selectors {
		m := driverSelector.FindStringSubmatch(sel)
		if m == nil {
			return "", false
		}
		d := m[1] + m[2]
		if driver != "" && d != driver {
			return "", false
		}
		driver = d
	}
	return driver, true
}

// classResources maps each driver to the extended resource its classes
// give all of its devices (classResource). A driver two classes give
// different resources is left out: which one a device is allocatable as is
// not known. It returns the classes with an extended resource name it
// could not use, for a log line.
func classResources(classes []deviceClass) (resources map[string]string, skipped []string) {
	resources = map[string]string{}
	conflict := map[string]bool{}
	for _, c := range classes {
		if c.ExtendedResourceName == "" {
			continue
		}
		driver, ok := classResource(c)
		if !ok {
			skipped = append(skipped, c.Name)
			continue
		}
		if r, seen := resources[driver]; seen && r != c.ExtendedResourceName {
			conflict[driver] = true
		}
		resources[driver] = c.ExtendedResourceName
	}
	for d := range conflict {
		delete(resources, d)
	}
	return resources, skipped
}

package allocator

import (
	"fmt"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
)

// Translate gives ids to the devices an allocator named only by number:
// a device without IDs gets the id of the inventory device of its Type with
// its Index (Volcano gpushare's nvidia-smi index), else with its Minor
// (Koordinator before v1.6). Devices with IDs are returned as they are.
//
// It runs when a pod's devices are answered, not when they are decoded, so
// that an inventory loaded or corrected later serves pods already recorded.
// devs is never modified: records are shared. When nothing needs
// translating the result is devs itself, so the common case costs nothing.
//
// A device the inventory cannot translate (no inventory, an unknown number,
// an inventory device without id) stays without IDs, which the merge
// skips, and is described in problems, one per device. inv may be nil: the
// daemon may run without an inventory. A query passes its one snapshot, so
// that all its pods are translated by the same inventory.
func Translate(devs []model.Device, inv *inventory.Snapshot) (out []model.Device, problems []error) {
	out = devs
	copied := false
	for i, d := range devs {
		if !namedByNumber(d) {
			continue
		}
		id, err := lookup(d, inv)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		if !copied {
			out = append([]model.Device(nil), devs...)
			copied = true
		}
		out[i].IDs = []string{id}
	}
	return out, problems
}

func namedByNumber(d model.Device) bool {
	return len(d.IDs) == 0 && (d.Index != nil || d.Minor != nil)
}

// lookup finds the id of a device named by Index or Minor.
func lookup(d model.Device, inv *inventory.Snapshot) (string, error) {
	what, n, by := "minor", d.Minor, inv.ByMinor
	if d.Index != nil {
		what, n, by = "index", d.Index, inv.ByIndex
	}
	name := fmt.Sprintf("%s %s device with %s %d", d.Allocator, d.Type, what, *n)
	if inv == nil {
		return "", fmt.Errorf("%s: no device inventory to translate it", name)
	}
	dev, ok := by(d.Type, *n)
	if !ok {
		return "", fmt.Errorf("%s: not in the node's device inventory", name)
	}
	if dev.ID == "" {
		return "", fmt.Errorf("%s: the inventory knows it (%s) but not its id", name, dev.BusID)
	}
	return dev.ID, nil
}

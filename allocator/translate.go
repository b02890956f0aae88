package allocator

import (
	"fmt"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
)

// Inventory is what Translate asks of the node's device inventory;
// *inventory.Inventory and *inventory.Snapshot implement it.
type Inventory interface {
	ByMinor(typ string, minor int64) (inventory.Device, bool)
	ByIndex(typ string, index int64) (inventory.Device, bool)
}

var (
	_ Inventory = (*inventory.Inventory)(nil)
	_ Inventory = (*inventory.Snapshot)(nil)
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
// skips, and is described in problems, one per device. inv may be nil,
// including a nil *inventory.Inventory or *inventory.Snapshot: the daemon
// may run without an inventory. A query should pass one Snapshot, so that
// all its pods are translated by the same inventory.
func Translate(devs []model.Device, inv Inventory) (out []model.Device, problems []error) {
	out = devs
	copied := false
	for i, d := range devs {
		if len(d.IDs) > 0 || d.Index == nil && d.Minor == nil {
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

// lookup finds the id of a device named by Index or Minor.
func lookup(d model.Device, inv Inventory) (string, error) {
	what, n, by := "minor", d.Minor, Inventory.ByMinor
	if d.Index != nil {
		what, n, by = "index", d.Index, Inventory.ByIndex
	}
	name := fmt.Sprintf("%s %s device with %s %d", d.Allocator, d.Type, what, *n)
	if isNil(inv) {
		return "", fmt.Errorf("%s: no device inventory to translate it", name)
	}
	dev, ok := by(inv, d.Type, *n)
	if !ok {
		return "", fmt.Errorf("%s: not in the node's device inventory", name)
	}
	if dev.ID == "" {
		return "", fmt.Errorf("%s: the inventory knows it (%s) but not its id", name, dev.BusID)
	}
	return dev.ID, nil
}

// isNil reports whether inv is nil or a nil pointer of the inventory's own
// types, whose methods would panic.
func isNil(inv Inventory) bool {
	switch v := inv.(type) {
	case nil:
		return true
	case *inventory.Inventory:
		return v == nil
	case *inventory.Snapshot:
		return v == nil
	}
	return false
}

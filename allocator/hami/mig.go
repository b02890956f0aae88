package hami

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
)

// MIGAnnotation is the pod annotation in which HAMi records the MIG
// instances of its dynamic MIG mode: the scheduler writes one entry per MIG
// slice (containerIndex, deviceIndex, gpuUUID, profile, placement), and the
// NVIDIA device plugin adds the instance's migUUID once it has created it.
// hami.io/vgpu-devices-allocated names each slice by its parent GPU only.
const MIGAnnotation = "hami.io/vgpu-mig-allocations"

// migSlot is a device's position in hami.io/vgpu-devices-allocated: the
// container entry, the device within it (non-empty devices counted), and
// the parent GPU written there, which the MIG entry must repeat.
type migSlot struct {
	container int
	device    int
	gpu       string
}

// migEntry is the part of one HAMiMIGAnnotation entry the decoder reads;
// profile, placement and the instance ids are left alone.
type migEntry struct {
	ContainerIndex *int   `json:"containerIndex"`
	DeviceIndex    *int   `json:"deviceIndex"`
	GPUUUID        string `json:"gpuUUID"`
	MIGUUID        string `json:"migUUID"`
}

// parseMIGAllocations returns the MIG instance of every slot whose instance
// the device plugin has recorded; slots still without a migUUID are absent
// (the scheduler has reserved them, the instance does not exist yet). Any
// malformed entry makes the whole annotation untrusted: an instance read
// from the wrong slot would name another container's MIG device.
func parseMIGAllocations(value string) (map[migSlot]string, error) {
	var entries []migEntry
	if err := json.Unmarshal([]byte(value), &entries); err != nil {
		return nil, fmt.Errorf("want a JSON list of MIG allocations: %w", err)
	}
	out := map[migSlot]string{}
	instances := map[string]bool{}
	for i, e := range entries {
		switch {
		case e.ContainerIndex == nil || *e.ContainerIndex < 0:
			return nil, fmt.Errorf("entry %d: no valid containerIndex", i)
		case e.DeviceIndex == nil || *e.DeviceIndex < 0:
			return nil, fmt.Errorf("entry %d: no valid deviceIndex", i)
		case e.GPUUUID == "":
			return nil, fmt.Errorf("entry %d: no gpuUUID", i)
		}
		if e.MIGUUID == "" {
			continue
		}
		if !strings.HasPrefix(e.MIGUUID, "MIG-") || parse.HasSpaceOrControl(e.MIGUUID) {
			return nil, fmt.Errorf("entry %d: migUUID %s is not MIG-<uuid>", i, parse.Quote(e.MIGUUID))
		}
		slot := migSlot{*e.ContainerIndex, *e.DeviceIndex, e.GPUUUID}
		if _, dup := out[slot]; dup {
			return nil, fmt.Errorf("entry %d: container %d device %d listed twice", i, slot.container, slot.device)
		}
		if instances[e.MIGUUID] {
			return nil, fmt.Errorf("entry %d: %s given to two slices", i, e.MIGUUID)
		}
		instances[e.MIGUUID] = true
		out[slot] = e.MIGUUID
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

package allocator

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
)

// node is a two-GPU node with one RDMA NIC, and a GPU sysfs found whose UUID
// nobody knows. nvidia-smi indices differ from minors, as they may.
func node() *inventory.Snapshot {
	return inventory.NewSnapshot([]inventory.Device{
		{Type: "gpu", ID: uuidA, Minor: ptr(int64(0)), Index: ptr(int64(1)), BusID: "0000:3b:00.0", Healthy: true},
		{Type: "gpu", ID: uuidB, Minor: ptr(int64(1)), Index: ptr(int64(0)), BusID: "0000:af:00.0", Healthy: true},
		{Type: "gpu", Minor: ptr(int64(7)), Index: ptr(int64(7)), BusID: "0000:d8:00.0"},
		{Type: "rdma", ID: "0000:01:00.0", Minor: ptr(int64(0)), BusID: "0000:01:00.0",
			VFs: []inventory.VF{{BusID: "0000:01:00.2"}}, Healthy: true},
	})
}

func withIDs(d model.Device, ids ...string) model.Device { d.IDs = ids; return d }

func TestTranslate(t *testing.T) {
	tests := []struct {
		name         string
		in           []model.Device
		want         []model.Device
		wantProblems []string
	}{
		{
			name: "a Koordinator GPU without id gets the UUID of its minor",
			in:   []model.Device{gpu("", 1)},
			want: []model.Device{gpu(uuidB, 1)},
		},
		{
			name: "a Koordinator RDMA PF without id gets the PF address of its minor",
			in:   []model.Device{rdma(0)},
			want: []model.Device{rdma(0, "0000:01:00.0")},
		},
		{
			name: "a gpushare index gets the UUID of that nvidia-smi index, not that minor",
			in:   []model.Device{gs(0), gs(1)},
			want: []model.Device{withIDs(gs(0), uuidB), withIDs(gs(1), uuidA)},
		},
		{
			name: "the index wins over the minor",
			in:   []model.Device{func() model.Device { d := gs(1); d.Minor = ptr(int64(1)); return d }()},
			want: []model.Device{func() model.Device { d := withIDs(gs(1), uuidA); d.Minor = ptr(int64(1)); return d }()},
		},
		{
			name: "devices with ids are left alone, whatever their minor",
			in:   []model.Device{gpu("GPU-from-annotation", 0), hv(uuidA, 0, 1, true)},
			want: []model.Device{gpu("GPU-from-annotation", 0), hv(uuidA, 0, 1, true)},
		},
		{
			name:         "an unknown minor stays without ids and is reported",
			in:           []model.Device{gpu("", 5), gpu("", 0)},
			want:         []model.Device{gpu("", 5), gpu(uuidA, 0)},
			wantProblems: []string{"koordinator gpu device with minor 5: not in the node's device inventory"},
		},
		{
			name:         "an unknown index stays without ids and is reported",
			in:           []model.Device{gs(9)},
			want:         []model.Device{gs(9)},
			wantProblems: []string{"volcano-gpushare gpu device with index 9: not in the node's device inventory"},
		},
		{
			name:         "a minor of another type does not match",
			in:           []model.Device{{Allocator: koordinator.Name, Type: "fpga", Resource: koordinator.DefaultFPGAResource, Minor: ptr(int64(0))}},
			want:         []model.Device{{Allocator: koordinator.Name, Type: "fpga", Resource: koordinator.DefaultFPGAResource, Minor: ptr(int64(0))}},
			wantProblems: []string{"koordinator fpga device with minor 0: not in the node's device inventory"},
		},
		{
			name:         "an inventory device without id translates nothing",
			in:           []model.Device{gs(7)},
			want:         []model.Device{gs(7)},
			wantProblems: []string{"volcano-gpushare gpu device with index 7: the inventory knows it (0000:d8:00.0) but not its id"},
		},
		{name: "no devices", in: nil, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := clone(tt.in)
			got, problems := Translate(tt.in, node())
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Translate:\n got %+v\nwant %+v", got, tt.want)
			}
			if msgs := messages(problems); !reflect.DeepEqual(msgs, tt.wantProblems) {
				t.Errorf("problems = %q; want %q", msgs, tt.wantProblems)
			}
			if !reflect.DeepEqual(tt.in, before) {
				t.Errorf("Translate modified its input:\n now %+v\nwas %+v", tt.in, before)
			}
		})
	}
}

func TestTranslateWithoutInventoryReportsEveryDeviceNamedByNumber(t *testing.T) {
	in := []model.Device{gpu("", 1), gs(0), gpu(uuidA, 0)}
	for name, inv := range map[string]*inventory.Snapshot{
		"nil snapshot":   nil,
		"empty snapshot": inventory.NewSnapshot(nil),
	} {
		got, problems := Translate(in, inv)
		if !reflect.DeepEqual(got, in) {
			t.Errorf("%s: Translate = %+v; want the input", name, got)
		}
		if len(problems) != 2 {
			t.Errorf("%s: problems = %q; want one per untranslated device", name, messages(problems))
		}
	}
}

func TestTranslateReturnsTheInputWhenNothingChanges(t *testing.T) {
	in := []model.Device{gpu(uuidA, 0), gpu("", 5)}
	got, _ := Translate(in, node())
	if &got[0] != &in[0] {
		t.Error("Translate copied devices it did not change")
	}
}

// clone copies devices and their ids, so that a later comparison sees any
// change Translate made to its input.
func clone(devs []model.Device) []model.Device {
	out := slices.Clone(devs)
	for i := range out {
		out[i].IDs = slices.Clone(out[i].IDs)
	}
	return out
}

func messages(errs []error) []string {
	var out []string
	for _, e := range errs {
		out = append(out, strings.TrimSpace(e.Error()))
	}
	return out
}

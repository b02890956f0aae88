package sysfs

import (
	"context"
	"encoding/csv"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podres-proxy/podres-proxy/inventory"
)

// TestLoadAgreesWithNvidiaSMIOnARealGPU checks the source against NVIDIA's
// own tool on a machine with NVIDIA GPUs: the fixtures the other tests use
// are this project's reading of sysfs and NVIDIA's procfs, and only a real
// driver shows whether that reading is right. For every GPU nvidia-smi
// lists, the source must find it at the same PCI address with the same
// UUID (the id pods are given) and index (Volcano's numbering), and a
// minor whose /dev/nvidiaN is that GPU's character device. It runs only
// where nvidia-smi is (CI machines have no GPU); PODRES_REQUIRE_GPU=1 makes
// a missing nvidia-smi a failure, for runs on a GPU machine that must not
// pass by skipping.
func TestLoadAgreesWithNvidiaSMIOnARealGPU(t *testing.T) {
	smi, err := exec.LookPath("nvidia-smi")
	if err != nil {
		if os.Getenv("PODRES_REQUIRE_GPU") != "" {
			t.Fatalf("PODRES_REQUIRE_GPU is set but there is no nvidia-smi: %v", err)
		}
		t.Skip("no nvidia-smi: not a machine with NVIDIA GPUs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, smi, "--query-gpu=index,uuid,pci.bus_id,mig.mode.current", "--format=csv,noheader").Output()
	if err != nil {
		t.Fatalf("nvidia-smi: %v", err)
	}
	rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil {
		t.Fatalf("nvidia-smi's CSV: %v\n%s", err, out)
	}
	if len(rows) == 0 {
		t.Fatalf("nvidia-smi lists no GPU")
	}

	devices, err := New(Options{}).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byBus := map[string]inventory.Device{}
	listed := 0
	for _, d := range devices {
		if d.Type == inventory.TypeGPU && d.Vendor == inventory.VendorNVIDIA {
			byBus[d.BusID] = d
			if d.ID != "" {
				listed++
			}
		}
	}
	for _, row := range rows {
		if len(row) != 4 {
			t.Fatalf("nvidia-smi row %q: want index, uuid, bus id, MIG mode", row)
		}
		index, uuid, bus, mig := strings.TrimSpace(row[0]), strings.TrimSpace(row[1]), strings.TrimSpace(row[2]), strings.TrimSpace(row[3])
		addr, ok := inventory.CanonicalPCIAddress(bus)
		if !ok {
			t.Fatalf("nvidia-smi's bus id %q is not a PCI address", bus)
		}
		d, ok := byBus[addr]
		if !ok {
			t.Errorf("GPU %s (%s at %s) is not found by the sysfs source", index, uuid, addr)
			continue
		}
		t.Logf("GPU %s: %s at %s, minor %v, NUMA node %v, MIG mode %s", index, d.ID, d.BusID, deref(d.Minor), deref(d.NUMANode), mig)
		if d.ID != uuid {
			t.Errorf("GPU at %s: id %q, nvidia-smi says %q", addr, d.ID, uuid)
		}
		if want, _ := strconv.ParseInt(index, 10, 64); d.Index == nil || *d.Index != want {
			t.Errorf("GPU at %s: index %v, nvidia-smi says %s", addr, deref(d.Index), index)
		}
		if d.Minor == nil {
			t.Errorf("GPU at %s: no minor", addr)
			continue
		}
		var st unix.Stat_t
		dev := filepath.Join("/dev", "nvidia"+strconv.FormatInt(*d.Minor, 10))
		if err := unix.Stat(dev, &st); err != nil {
			t.Errorf("GPU at %s: minor %d, but %v", addr, *d.Minor, err)
		} else if st.Mode&unix.S_IFMT != unix.S_IFCHR || int64(unix.Minor(st.Rdev)) != *d.Minor {
			t.Errorf("GPU at %s: minor %d, but %s is not that character device (mode %o, minor %d)", addr, *d.Minor, dev, st.Mode, unix.Minor(st.Rdev))
		}
	}
	if listed != len(rows) {
		t.Errorf("the source lists %d NVIDIA GPUs with an id, nvidia-smi %d", listed, len(rows))
	}
}

func deref(p *int64) any {
	if p == nil {
		return "unknown"
	}
	return *p
}

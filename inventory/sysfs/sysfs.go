// Package sysfs is the inventory source that discovers the node's GPUs and
// RDMA NICs, with their SR-IOV virtual functions, and their NUMA nodes from
// sysfs, as node-feature-discovery's source/pci does; NVIDIA's procfs adds the
// GPUs' UUIDs and minors. It is where a NUMA node comes from when neither the
// Device object nor the operator's file says.
package sysfs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/inventory"
)

// DefaultInterval is how often a Source rescans: PCI devices rarely
// change, but VFs appear when an operator (or the SR-IOV operator) sets
// sriov_numvfs after boot.
const DefaultInterval = 60 * time.Second

// PCI vendor ids and class codes the sysfs source recognises.
const (
	pciVendorNVIDIA    = 0x10de
	pciVendorAMD       = 0x1002
	pciClassDisplay    = 0x03   // class 0x03xxxx: VGA, 3D and other display controllers
	pciClassInfiniBand = 0x0207 // class 0x0207xx
)

// Options configure a Source.
type Options struct {
	// SysfsRoot is where sysfs is mounted; "" means /sys. Tests point it at
	// a fixture tree.
	SysfsRoot string
	// ProcRoot is where procfs is mounted; "" means /proc. NVIDIA GPUs'
	// UUIDs and minors are read from
	// <ProcRoot>/driver/nvidia/gpus/<PCI address>/information.
	ProcRoot string
	// Interval between scans; 0 means DefaultInterval.
	Interval time.Duration
	// Logger receives one warning per GPU whose UUID cannot be read; nil
	// means logrus's standard logger.
	Logger logrus.FieldLogger
}

// Source discovers GPUs and RDMA NICs (with their SR-IOV VFs) and their
// NUMA nodes from sysfs:
//
//   - a GPU is a display-class device (0x03xxxx) of NVIDIA or AMD. NVIDIA
//     GPUs get their UUID (the id), minor and index from NVIDIA's procfs; a
//     GPU the driver does not show there (bound to vfio-pci, driver not
//     loaded) is listed by PCI address only, with no id, so it can still be
//     joined with the Device object or the file, but is not reported as
//     allocatable. AMD GPUs are named by PCI address, as AMD's device plugin
//     names them;
//   - an RDMA NIC is a device with an infiniband/ directory, or of class
//     InfiniBand (0x0207xx). Its id is its PCI address, its VFs are its
//     virtfnN links, its minor is N of its mlx5_N device (as Koordinator
//     numbers them), and it is unhealthy when an RDMA port is not ACTIVE;
//   - VFs (devices with a physfn link) are listed under their PF only.
//
// numa_node -1 means unknown. Devices sysfs knows nothing of (health of
// GPUs) are reported healthy.
type Source struct {
	sysfs, proc string
	interval    time.Duration
	log         logrus.FieldLogger
	warned      map[string]bool // GPUs already warned about; Load is serialized
}

// New returns a sysfs source.
func New(opts Options) *Source {
	s := &Source{sysfs: opts.SysfsRoot, proc: opts.ProcRoot, interval: opts.Interval, log: opts.Logger, warned: make(map[string]bool)}
	if s.sysfs == "" {
		s.sysfs = "/sys"
	}
	if s.proc == "" {
		s.proc = "/proc"
	}
	if s.interval == 0 {
		s.interval = DefaultInterval
	}
	if s.log == nil {
		s.log = logrus.StandardLogger()
	}
	return s
}

// Name implements inventory.Source.
func (s *Source) Name() string { return inventory.SourceSysfs }

// Interval implements inventory.Source.
func (s *Source) Interval() time.Duration { return s.interval }

// Load implements inventory.Source: one scan of <SysfsRoot>/bus/pci/devices.
func (s *Source) Load(ctx context.Context) ([]inventory.Device, error) {
	dir := filepath.Join(s.sysfs, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing PCI devices: %w", err)
	}
	var devices []inventory.Device
	var enumerated []int // NVIDIA GPUs the driver enumerates, for Index
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		addr, ok := inventory.CanonicalPCIAddress(e.Name())
		if !ok {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if exists(filepath.Join(path, "physfn")) {
			continue // a VF: listed under its PF
		}
		class, err1 := readHex(filepath.Join(path, "class"))
		vendor, err2 := readHex(filepath.Join(path, "vendor"))
		if err1 != nil || err2 != nil {
			continue // vanished mid-scan, or not a PCI function
		}
		switch {
		case class>>16 == pciClassDisplay && (vendor == pciVendorNVIDIA || vendor == pciVendorAMD):
			d, listed := s.gpu(path, addr, vendor)
			if listed {
				enumerated = append(enumerated, len(devices))
			}
			devices = append(devices, d)
		case isDir(filepath.Join(path, "infiniband")) || class>>8 == pciClassInfiniBand:
			devices = append(devices, rdma(path, addr))
		}
	}
	// NVML, and so nvidia-smi, numbers the GPUs the driver shows in PCI
	// address order.
	slices.SortFunc(enumerated, func(a, b int) int { return inventory.ComparePCI(devices[a].BusID, devices[b].BusID) })
	for i, di := range enumerated {
		devices[di].Index = new(int64(i))
	}
	return devices, nil
}

// gpu describes a GPU; listed reports whether NVIDIA's driver enumerates it.
func (s *Source) gpu(path, addr string, vendor uint64) (d inventory.Device, listed bool) {
	d = inventory.Device{Type: inventory.TypeGPU, BusID: addr, NUMANode: readNUMA(path), Healthy: true}
	if vendor == pciVendorAMD {
		d.Vendor, d.ID = inventory.VendorAMD, addr
		return d, false
	}
	d.Vendor = inventory.VendorNVIDIA
	infoPath := filepath.Join(s.proc, "driver", "nvidia", "gpus", addr, "information")
	info, err := readNVIDIAInfo(infoPath)
	if err != nil {
		if !s.warned[addr] {
			s.warned[addr] = true
			s.log.WithField("busID", addr).WithError(err).Warn("NVIDIA GPU has no readable driver information: listed by PCI address only, without UUID, minor or index")
		}
		return d, false
	}
	d.ID, d.Minor = info.uuid, info.minor
	if info.excluded {
		d.Healthy = false // NVreg_ExcludedGpus: the driver will not use it
		return d, false
	}
	return d, true
}

type nvidiaInfo struct {
	uuid     string
	minor    *int64
	excluded bool
}

// readNVIDIAInfo parses the driver's per-GPU information file, lines of
// "Key: value". Its UUID reads as question marks until the GPU has been
// initialised (no persistence mode); it is then unknown.
func readNVIDIAInfo(path string) (nvidiaInfo, error) {
	content, err := os.ReadFile(path)
	if err != nil {
		return nvidiaInfo{}, err
	}
	var info nvidiaInfo
	sc := bufio.NewScanner(bytes.NewReader(content))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		switch strings.TrimSpace(key) {
		case "GPU UUID":
			if strings.HasPrefix(value, "GPU-") && !strings.Contains(value, "?") {
				info.uuid = value
			}
		case "Device Minor":
			if n, err := strconv.ParseInt(value, 10, 64); err == nil && n >= 0 {
				info.minor = &n
			}
		case "GPU Excluded":
			info.excluded = strings.EqualFold(value, "yes")
		}
	}
	if err := sc.Err(); err != nil {
		return nvidiaInfo{}, fmt.Errorf("reading %s: %w", path, err)
	}
	return info, nil
}

var (
	ibdevMinor = regexp.MustCompile(`_(\d+)$`)
	virtfn     = regexp.MustCompile(`^virtfn(\d+)$`)
)

// rdma describes an RDMA NIC's physical function and its VFs.
func rdma(path, addr string) inventory.Device {
	d := inventory.Device{Type: inventory.TypeRDMA, ID: addr, BusID: addr, NUMANode: readNUMA(path), Healthy: true}
	ibdevs, _ := os.ReadDir(filepath.Join(path, "infiniband"))
	for _, ib := range ibdevs {
		if m := ibdevMinor.FindStringSubmatch(ib.Name()); m != nil && d.Minor == nil {
			if n, err := strconv.ParseInt(m[1], 10, 64); err == nil {
				d.Minor = &n
			}
		}
		if !portsActive(filepath.Join(path, "infiniband", ib.Name(), "ports")) {
			d.Healthy = false
		}
	}
	entries, _ := os.ReadDir(path)
	type vfLink struct {
		n    int
		addr string
		path string
	}
	var links []vfLink
	for _, e := range entries {
		m := virtfn.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			continue
		}
		link := filepath.Join(path, e.Name())
		target, err := os.Readlink(link)
		if err != nil {
			continue
		}
		vfAddr, ok := inventory.CanonicalPCIAddress(filepath.Base(target))
		if !ok {
			continue
		}
		links = append(links, vfLink{n, vfAddr, link})
	}
	slices.SortFunc(links, func(a, b vfLink) int { return a.n - b.n })
	for _, l := range links {
		d.VFs = append(d.VFs, inventory.VF{BusID: l.addr, NUMANode: readNUMA(l.path)})
	}
	return d
}

// portsActive reports whether every port of an RDMA device is ACTIVE, as
// Koordinator judges RDMA health. No port information means healthy: there
// is nothing to judge by.
func portsActive(dir string) bool {
	ports, err := os.ReadDir(dir)
	if err != nil {
		return true
	}
	for _, p := range ports {
		state, err := os.ReadFile(filepath.Join(dir, p.Name(), "state"))
		if err != nil || !bytes.Contains(state, []byte("ACTIVE")) {
			return false
		}
	}
	return true
}

func readHex(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimPrefix(strings.TrimSpace(string(b)), "0x")
	v, err := strconv.ParseUint(s, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", path, err)
	}
	return v, nil
}

// readNUMA reads a device's numa_node; -1 (no affinity) and unreadable mean
// unknown.
func readNUMA(devicePath string) *int64 {
	b, err := os.ReadFile(filepath.Join(devicePath, "numa_node"))
	if err != nil {
		return nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return nil
	}
	return &n
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

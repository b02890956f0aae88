package proxy_test

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/podres-proxy/podres-proxy/devinfo"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/test/clients"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// Multus copies the VF's device-info file into the pod's network-status
// right after its List, during the same CNI ADD: the file must be there
// when the answer naming the VF arrives.
func TestTheVFsDeviceInfoIsWrittenBeforeMultusGetsTheVF(t *testing.T) {
	dir := shortDir(t)
	w := devinfo.New(devinfo.Options{Dir: dir, SysfsRoot: shortDir(t)})
	h := newHarness(t, withProviders(func(d *proxy.Providers) { d.DeviceInfo = w }))
	h.k.SetPods(fk.NewPod("team", "rdma-pod", "uid-1", byKoord, fk.WithAnnotation(koordKey, gpuAndVF),
		fk.WithContainer("main", map[string]string{"koordinator.sh/rdma": "1", "koordinator.sh/gpu-core": "100"})))
	ids, err := clients.MultusDeviceIDs(ctx(t), h.socket, "team", "rdma-pod", "koordinator.sh/rdma")
	if err != nil || !slices.Equal(ids, []string{vfAddr}) {
		t.Fatalf("Multus got %v, %v; want the VF", ids, err)
	}
	b, err := os.ReadFile(w.Path("koordinator.sh/rdma", vfAddr))
	if err != nil {
		t.Fatalf("no device-info for the VF Multus got: %v", err)
	}
	var in devinfo.Info
	if err := json.Unmarshal(b, &in); err != nil || in.Type != "pci" || in.PCI.PCIAddress != vfAddr {
		t.Errorf("device-info %s (%v), want the VF's pci-address", b, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%d device-info files, want the VF's only (none for the GPU)", len(entries))
	}
}

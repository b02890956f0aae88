package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/cli/provenance"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/inventory/publish"
	"github.com/podres-proxy/podres-proxy/state/persist"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/inventorytest"
	"github.com/podres-proxy/podres-proxy/test/poll"
	"github.com/podres-proxy/podres-proxy/test/tabletest"
)

// provenanceNode runs serve on the two-NUMA node whose sysfs does not know
// GPU0's NUMA node (numa_node -1) and whose inventory file says it is 0, so
// that the GPU's node comes from the file and the VF's from sysfs. It waits
// until the state store has recorded ml/trainer on disk, as it would have
// long before an operator asks, and returns the proxy's socket, the
// kubelet's and the state directory.
func provenanceNode(t *testing.T) (socket, kubeletSocket, stateDir string) {
	t.Helper()
	dir := shortTempDir(t)
	k := twoNUMAKubelet(t, dir)
	node := inventorytest.TwoNUMANode(t)
	inventorytest.WriteFile(t, filepath.Join(node.PCI(inventorytest.GPU0BusID), "numa_node"), "-1\n")
	invFile := filepath.Join(t.TempDir(), "inventory.json")
	inventorytest.WriteFile(t, invFile, `{"version": 1, "devices": [{"type": "gpu", "id": "`+inventorytest.GPU0+`", "numaNode": 0}]}`)
	socket, stateDir = serveOnTwoNUMANode(t, k, dir, node, "--inventory-file", invFile)

	// The proxy learns the pod from /pods when it is first asked about it.
	if code, _, errOut := runCmd(t, "query", "list", "--socket", socket); code != 0 {
		t.Fatalf("query list: exit %d: %s", code, errOut)
	}
	poll.Until(t, "ml/trainer's record on disk", func() bool {
		records, _ := persist.ReadDir(stateDir)
		return slices.ContainsFunc(records, func(r *record.Record) bool { return r.Name == "trainer" && len(r.Devices) == 2 })
	})
	return socket, k.Socket, stateDir
}

func TestQuerySourcesTellsTheKubeletsDevicesFromTheAllocatorsAndNamesTheSourceOfEachNUMANode(t *testing.T) {
	socket, kubeletSocket, stateDir := provenanceNode(t)
	gpu, vf := inventorytest.GPU0, inventorytest.RDMAVF0
	sourcesFlags := []string{"--socket", socket, "--kubelet-socket", kubeletSocket, "--state-dir", stateDir, "--sources"}

	code, out, errOut := runCmd(t, append([]string{"query", "list"}, sourcesFlags...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("query list --sources: exit %d, stderr %q", code, errOut)
	}
	if header := strings.Fields(strings.SplitN(out, "\n", 2)[0]); !slices.Equal(header, []string{"NAMESPACE", "POD", "CONTAINER", "RESOURCE", "DEVICE", "NUMA", "SOURCE", "NUMA-SOURCE"}) {
		t.Errorf("header %q", header)
	}
	tabletest.EqualRows(t, "query list --sources", tabletest.Rows(t, out),
		"ml trainer train example.com/dev dev-1 1 kubelet kubelet",
		"ml trainer train nvidia.com/gpu "+gpu+" 0 koordinator file",
		"ml trainer train koordinator.sh/rdma "+vf+" 1 koordinator sysfs",
	)

	// JSON: the answer as without --sources, plus the same facts.
	code, out, errOut = runCmd(t, append([]string{"query", "get", "ml/trainer", "-o", "json"}, sourcesFlags...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("query get --sources -o json: exit %d, stderr %q", code, errOut)
	}
	var answer struct {
		PodResources struct {
			Name string `json:"name"`
		} `json:"podResources"`
		DeviceSources []provenance.DeviceOrigin `json:"deviceSources"`
	}
	if err := json.Unmarshal([]byte(out), &answer); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if answer.PodResources.Name != "trainer" {
		t.Errorf("the answer's own fields are gone:\n%s", out)
	}
	var got []string
	for _, o := range answer.DeviceSources {
		b, _ := json.Marshal(o)
		got = append(got, string(b))
	}
	want := []string{
		`{"namespace":"ml","pod":"trainer","container":"train","resource":"example.com/dev","deviceId":"dev-1","numa":[1],"source":"kubelet","numaSource":"kubelet"}`,
		`{"namespace":"ml","pod":"trainer","container":"train","resource":"nvidia.com/gpu","deviceId":"` + gpu + `","numa":[0],"source":"koordinator","numaSource":"file"}`,
		`{"namespace":"ml","pod":"trainer","container":"train","resource":"koordinator.sh/rdma","deviceId":"` + vf + `","numa":[1],"source":"koordinator","numaSource":"sysfs"}`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("deviceSources:\ngot:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}

	code, out, errOut = runCmd(t, append([]string{"query", "allocatable"}, sourcesFlags...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("query allocatable --sources: exit %d, stderr %q", code, errOut)
	}
	tabletest.EqualRows(t, "query allocatable --sources", tabletest.Rows(t, out),
		"example.com/dev dev-0 0 kubelet kubelet",
		"example.com/dev dev-1 1 kubelet kubelet",
		"koordinator.sh/rdma "+inventorytest.RDMAVF0+" 1 sysfs sysfs",
		"koordinator.sh/rdma "+inventorytest.RDMAVF1+" 1 sysfs sysfs",
		"nvidia.com/gpu "+inventorytest.GPU0+" 0 file file",
		"nvidia.com/gpu "+inventorytest.GPU1+" 1 sysfs sysfs",
	)
}

func TestQuerySourcesStillAnswersWhenTheKubeletAndTheStateDirectoryCannotBeRead(t *testing.T) {
	socket, _, _ := provenanceNode(t)
	missing := filepath.Join(t.TempDir(), "missing")
	code, out, errOut := runCmd(t, "query", "list", "--sources", "--socket", socket,
		"--kubelet-socket", filepath.Join(missing, "kubelet.sock"), "--state-dir", missing)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, note := range []string{
		"note: --sources: cannot compare with the kubelet's own answer: ask " + filepath.Join(missing, "kubelet.sock"),
		"note: --sources: no allocators: read state directory " + missing,
		"note: --sources: NUMA sources of added devices unknown: " + filepath.Join(missing, publish.FileName),
	} {
		if !strings.Contains(errOut, note) {
			t.Errorf("stderr lacks %q:\n%s", note, errOut)
		}
	}
	tabletest.EqualRows(t, "query list --sources with nothing to compare with", tabletest.Rows(t, out),
		"ml trainer train example.com/dev dev-1 1 unknown unknown",
		"ml trainer train nvidia.com/gpu "+inventorytest.GPU0+" 0 unknown unknown",
		"ml trainer train koordinator.sh/rdma "+inventorytest.RDMAVF0+" 1 unknown unknown",
	)
}

func TestInspectOfARunningServeShowsEachDevicesAllocatorAndWhereItsNUMANodeCameFrom(t *testing.T) {
	_, _, stateDir := provenanceNode(t)
	code, out, errOut := runCmd(t, "inspect", "--state-dir", stateDir, "ml/trainer")
	if code != 0 || errOut != "" {
		t.Fatalf("inspect: exit %d, stderr %q", code, errOut)
	}
	if !tabletest.HasLine(out, "trainer", "nvidia.com/gpu="+inventorytest.GPU0+"(koordinator),koordinator.sh/rdma="+inventorytest.RDMAVF0+"(koordinator)") {
		t.Errorf("the pod's row does not name the allocator of each device:\n%s", out)
	}
	_, placement, ok := strings.Cut(out, "Where the devices are")
	if !ok {
		t.Fatalf("no placement section:\n%s", out)
	}
	tabletest.EqualRows(t, "placement", tabletest.Rows(t, placement)[1:],
		"ml/trainer nvidia.com/gpu "+inventorytest.GPU0+" koordinator 0 from file",
		"ml/trainer koordinator.sh/rdma "+inventorytest.RDMAVF0+" koordinator 1 from sysfs",
	)

	// serve published its inventory before it was ready.
	code, out, errOut = runCmd(t, "inspect", "--state-dir", stateDir, "--inventory", "-o", "json")
	if code != 0 {
		t.Fatalf("inspect --inventory -o json: exit %d: %s", code, errOut)
	}
	var published publish.File
	if err := json.Unmarshal([]byte(out), &published); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(published.Sources, []string{inventory.SourceFile, inventory.SourceSysfs}) || len(published.Devices) != 3 {
		t.Errorf("published sources %v and %d devices; want file, sysfs and the node's 3 devices", published.Sources, len(published.Devices))
	}
	if fi, err := os.Stat(filepath.Join(stateDir, publish.FileName)); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("inventory.json: %v, %v; want mode 0640", fi, err)
	}
}

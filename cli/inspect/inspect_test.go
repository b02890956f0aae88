package inspect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/internal/cmdline"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/inventory/publish"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/tabletest"
)

// gpuDecoder decodes "example.com/gpu: id,id" and fails on "bad".
type gpuDecoder struct{}

func (gpuDecoder) Relevant(key string) bool { return key == "example.com/gpu" }

func (d gpuDecoder) MaxAnnotationBytes(key string) int {
	if d.Relevant(key) {
		return 64 << 10
	}
	return 0
}

func (gpuDecoder) Decode(_ model.PodRef, ann map[string]string) ([]model.Device, []error) {
	v := ann["example.com/gpu"]
	if v == "bad" {
		return nil, []error{errors.New("example.com/gpu: cannot decode \"bad\"")}
	}
	return []model.Device{{Allocator: "example", Resource: "nvidia.com/gpu", IDs: strings.Split(v, ",")}}, nil
}

// newStateDir writes a state directory with a running pod with two GPUs,
// a pending pod whose annotation cannot be decoded, and a removed pod. The
// store stays open (locked) until the test ends, as under a running serve.
func newStateDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	s, err := state.Open(dir, state.Options{Decoder: gpuDecoder{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.ObserveSandbox(record.OriginNRI, model.Sandbox{ID: "5f2a9c0e7d1b4a3c8e6f", UID: "uid-train", Namespace: "ml", Name: "train-0",
		Annotations: map[string]string{"example.com/gpu": "GPU-aaa,GPU-bbb"}, Ready: true})
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c1", SandboxID: "5f2a9c0e7d1b4a3c8e6f", Name: "trainer", State: model.ContainerRunning})
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c2", SandboxID: "5f2a9c0e7d1b4a3c8e6f", Name: "sidecar", State: model.ContainerStopped})
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: "uid-web", Namespace: "default", Name: "web", Phase: "Pending",
		Annotations: map[string]string{"example.com/gpu": "bad"}}})
	s.ObserveSandbox(record.OriginCRI, model.Sandbox{ID: "sb-old", UID: "uid-old", Namespace: "ml", Name: "train-0", Ready: true})
	s.SandboxRemoved(record.OriginCRI, "sb-old", "")
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runCmd runs inspect as podres-proxy does and returns its exit status.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cmdline.ExitCode("inspect", Run(context.Background(), args, &out, &errOut), &errOut)
	return code, out.String(), errOut.String()
}

func TestInspectTableShowsEachPodWithDevicesContainersAndDecodeErrors(t *testing.T) {
	dir := newStateDir(t)
	code, out, errOut := runCmd(t, "--state-dir", dir)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 4 {
		t.Fatalf("want a header and three pods:\n%s", out)
	}
	for _, col := range []string{"NAMESPACE", "NAME", "UID", "STATE", "SANDBOX", "CONTAINERS", "DEVICES", "ERRORS", "SOURCES", "UPDATED"} {
		if !strings.Contains(lines[0], col) {
			t.Errorf("header has no %s: %q", col, lines[0])
		}
	}
	row := func(uid string) string {
		for _, l := range lines {
			if strings.Contains(l, " "+uid+" ") {
				return l
			}
		}
		t.Fatalf("no row for %s:\n%s", uid, out)
		return ""
	}
	train := strings.Fields(row("uid-train"))
	want := []string{"ml", "train-0", "uid-train", "ready", "5f2a9c0e7d1b4", "trainer:running,sidecar:stopped",
		"nvidia.com/gpu=GPU-aaa(example),nvidia.com/gpu=GPU-bbb(example)", "0", "nri"}
	if len(train) < len(want) || strings.Join(train[:len(want)], " ") != strings.Join(want, " ") {
		t.Errorf("row of the running pod:\n got %q\nwant %q", train, want)
	}
	web := strings.Fields(row("uid-web"))
	if strings.Join(web[:9], " ") != "default web uid-web pending <none> <none> <none> 1 kubelet" {
		t.Errorf("row of the pending pod: %q", web)
	}
	if old := strings.Fields(row("uid-old")); old[3] != "removed" {
		t.Errorf("row of the removed pod: %q", old)
	}
	if !strings.Contains(out, `default/web (uid uid-web): example.com/gpu: cannot decode "bad"`) {
		t.Errorf("the decode error is not shown in full:\n%s", out)
	}
	// Sorted by namespace, then name, then uid.
	if !(strings.Index(out, "uid-web") < strings.Index(out, "uid-old") && strings.Index(out, "uid-old") < strings.Index(out, "uid-train")) {
		t.Errorf("rows not sorted by namespace, name, uid:\n%s", out)
	}
}

func TestInspectJSONIsTheListOfRecords(t *testing.T) {
	dir := newStateDir(t)
	code, out, errOut := runCmd(t, "--state-dir", dir, "-o", "json")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var generic []map[string]any
	if err := json.Unmarshal([]byte(out), &generic); err != nil {
		t.Fatalf("not a JSON list: %v\n%s", err, out)
	}
	if len(generic) != 3 {
		t.Fatalf("%d records, want 3", len(generic))
	}
	for _, r := range generic {
		for _, k := range []string{"uid", "namespace", "name", "state", "containers", "devices"} {
			if _, ok := r[k]; !ok {
				t.Errorf("record %v has no %q", r["uid"], k)
			}
		}
	}
	var recs []record.Record
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatal(err)
	}
	train := recs[2]
	if train.UID != "uid-train" || train.SandboxID != "5f2a9c0e7d1b4a3c8e6f" || len(train.Devices) != 1 || len(train.Containers) != 2 {
		t.Errorf("running pod in json: %+v", train)
	}
	if !strings.HasPrefix(out, "[\n  {\n    \"schemaVersion\": 3,") {
		t.Errorf("json is not indented:\n%s", out[:min(len(out), 80)])
	}
}

func TestInspectOfAnEmptyDirectoryPrintsAnEmptyList(t *testing.T) {
	dir := t.TempDir()
	code, out, _ := runCmd(t, "--state-dir", dir, "-o", "json")
	if code != 0 || out != "[]\n" {
		t.Errorf("json of an empty state directory: exit %d, %q; want []", code, out)
	}
	code, out, errOut := runCmd(t, "--state-dir", dir)
	if code != 0 || out != "" || !strings.Contains(errOut, "no pods in state directory") {
		t.Errorf("table of an empty state directory: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestInspectFiltersByNamespaceAndName(t *testing.T) {
	dir := newStateDir(t)
	// The flag may come after the pod, as with kubectl.
	code, out, errOut := runCmd(t, "ml/train-0", "--state-dir", dir, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var recs []record.Record
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Name != "train-0" || recs[1].Name != "train-0" {
		t.Errorf("ml/train-0 gave %d records, want both sandboxes of that name: %+v", len(recs), recs)
	}

	code, out, errOut = runCmd(t, "--state-dir", dir, "ml/nope")
	want := "no pod ml/nope in state directory " + dir
	if code != 1 || out != "" || !strings.Contains(errOut, want) {
		t.Errorf("unknown pod: exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, want)
	}
}

func TestInspectWarnsAboutUnreadableFilesAndPrintsTheRest(t *testing.T) {
	dir := newStateDir(t)
	bad := filepath.Join(dir, "pods", "uid-broken.json")
	if err := os.WriteFile(bad, []byte(`{"schemaVersion": 2, "uid": "uid-bro`), 0o640); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd(t, "--state-dir", dir)
	if code != 0 {
		t.Fatalf("exit %d with one bad file; want 0", code)
	}
	if !strings.Contains(errOut, "warning: record file "+bad) {
		t.Errorf("stderr does not name the bad file: %q", errOut)
	}
	if !strings.Contains(out, "uid-train") {
		t.Errorf("the good records were not printed:\n%s", out)
	}
	if _, err := os.Stat(bad); err != nil {
		t.Errorf("inspect moved or removed the bad file: %v", err)
	}
}

func TestInspectFailsWhenTheDirectoryCannotBeRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	code, out, errOut := runCmd(t, "--state-dir", dir)
	if code != 1 || out != "" || !strings.Contains(errOut, dir) {
		t.Errorf("missing directory: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestInspectRejectsBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"-o", "yaml"},
		{"just-a-name"},
		{"a/b", "c/d"},
		{"/name"},
		{"--no-such-flag"},
	} {
		if code, _, errOut := runCmd(t, args...); code != 2 || errOut == "" {
			t.Errorf("%q: exit %d, stderr %q; want a usage error (2)", args, code, errOut)
		}
	}
}

func TestDevicesWithoutIDsShowWhatTheAllocatorNamed(t *testing.T) {
	minor, index := int64(3), int64(1)
	got := devicesColumn([]model.Device{
		{Resource: "nvidia.com/gpu", Minor: &minor},
		{Resource: "nvidia.com/gpu", Index: &index},
		{Resource: "example.com/fpga"},
	}, nil)
	if want := "nvidia.com/gpu=minor:3,nvidia.com/gpu=index:1,example.com/fpga=?"; got != want {
		t.Errorf("devicesColumn = %q, want %q", got, want)
	}
}

func TestAgeReadsLikeKubectl(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{
		5 * time.Second:               "5s",
		3*time.Minute + 7*time.Second: "3m7s",
		42 * time.Minute:              "42m",
		5*time.Hour + 30*time.Minute:  "5h30m",
		72 * time.Hour:                "3d",
		-time.Second:                  "0s",
	} {
		if got := age(now, now.Add(-d)); got != want {
			t.Errorf("age(%v) = %q, want %q", d, got, want)
		}
	}
	if got := age(now, time.Time{}); got != "<unknown>" {
		t.Errorf("age of a zero time = %q", got)
	}
}

// writeInventory publishes an inventory into a state directory as serve
// does.
func writeInventory(t *testing.T, dir string, devices ...inventory.Device) {
	t.Helper()
	err := publish.Write(filepath.Join(dir, publish.FileName), &publish.File{
		Version: publish.Version, WrittenAt: time.Now().Add(-90 * time.Second),
		Sources: []string{inventory.SourceDeviceCR, inventory.SourceSysfs}, Devices: devices,
	})
	if err != nil {
		t.Fatal(err)
	}
}

func int64p(v int64) *int64 { return &v }

func TestInspectShowsWhereTheInventoryPutsEachDeviceAndWhoSaidSo(t *testing.T) {
	dir := newStateDir(t)
	writeInventory(t, dir, inventory.Device{Type: "gpu", ID: "GPU-aaa", BusID: "0000:3b:00.0", NUMANode: int64p(0),
		NUMASource: inventory.SourceSysfs, Healthy: true, Source: inventory.SourceDeviceCR})
	code, out, errOut := runCmd(t, "--state-dir", dir)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	head, placement, ok := strings.Cut(out, "\nWhere the devices are, from the node inventory serve wrote 90s ago to "+
		filepath.Join(dir, "inventory.json")+" (sources: device-cr, sysfs):\n")
	if !ok {
		t.Fatalf("no placement section naming the inventory file, its age and sources:\n%s", out)
	}
	if !strings.Contains(head, `default/web (uid uid-web)`) {
		t.Errorf("the decode errors are not listed before the placement:\n%s", out)
	}
	tabletest.EqualRows(t, "placement", tabletest.Rows(t, placement),
		"ml/train-0 nvidia.com/gpu GPU-aaa example 0 from sysfs",
		"ml/train-0 nvidia.com/gpu GPU-bbb example not in the inventory",
	)
}

func TestInspectTranslatesDevicesNamedByMinorThroughTheInventoryAsTheProxyDoes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	koord := allocator.NewSet(nil, nil, koordinator.New(koordinator.Options{}))
	s, err := state.Open(dir, state.Options{Decoder: koord})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.ObserveSandbox(record.OriginNRI, model.Sandbox{ID: "sb-1", UID: "uid-old-koord", Namespace: "ml", Name: "legacy", Ready: true,
		Annotations: map[string]string{"scheduling.koordinator.sh/device-allocated": `{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100"}}]}`}})
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	writeInventory(t, dir, inventory.Device{Type: "gpu", ID: "GPU-minor-1", Minor: int64p(1), NUMANode: int64p(1),
		NUMASource: inventory.SourceDeviceCR, Healthy: true, Source: inventory.SourceDeviceCR})

	code, out, errOut := runCmd(t, "--state-dir", dir)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if !tabletest.HasLine(out, "legacy", "nvidia.com/gpu=minor:1(koordinator)") {
		t.Errorf("the DEVICES column should show what the annotation named:\n%s", out)
	}
	_, placement, _ := strings.Cut(out, "Where the devices are")
	tabletest.EqualRows(t, "placement", tabletest.Rows(t, placement)[1:], "ml/legacy nvidia.com/gpu GPU-minor-1 koordinator 1 from device-cr")

	// Without the device in the inventory the number stays.
	writeInventory(t, dir)
	_, out, _ = runCmd(t, "--state-dir", dir)
	_, placement, _ = strings.Cut(out, "Where the devices are")
	tabletest.EqualRows(t, "placement", tabletest.Rows(t, placement)[1:], "ml/legacy nvidia.com/gpu minor:1 koordinator not in the inventory")
}

func TestInspectWithoutAnInventorySaysSoAndStillPrintsThePods(t *testing.T) {
	dir := newStateDir(t)
	code, out, errOut := runCmd(t, "--state-dir", dir)
	if code != 0 || errOut != "" {
		t.Fatalf("no inventory file: exit %d, stderr %q", code, errOut)
	}
	if !strings.Contains(out, "uid-train") || !strings.Contains(out, "\nNUMA nodes unknown: no node inventory in "+filepath.Join(dir, "inventory.json")) {
		t.Errorf("no inventory file:\n%s", out)
	}

	if err := os.WriteFile(filepath.Join(dir, "inventory.json"), []byte(`{"version": 7}`), 0o640); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCmd(t, "--state-dir", dir)
	if code != 0 || !strings.Contains(errOut, "warning: "+filepath.Join(dir, "inventory.json")+": version 7, this podres-proxy reads version 1") {
		t.Errorf("an inventory file of another version: exit %d, stderr %q; want a warning", code, errOut)
	}
	if !strings.Contains(out, "uid-train") || !strings.Contains(out, "cannot be read (see the warning)") {
		t.Errorf("an inventory file of another version:\n%s", out)
	}
}

func TestInspectInventoryPrintsEveryDeviceAndVFWithItsNUMASource(t *testing.T) {
	dir := newStateDir(t)
	writeInventory(t, dir,
		inventory.Device{Type: "gpu", ID: "GPU-aaa", Vendor: "nvidia", Minor: int64p(2), Index: int64p(0), BusID: "0000:3b:00.0",
			NUMANode: int64p(0), NUMASource: inventory.SourceSysfs, Healthy: true, Source: inventory.SourceDeviceCR},
		inventory.Device{Type: "rdma", ID: "0000:d8:00.0", BusID: "0000:d8:00.0", NUMANode: int64p(1), NUMASource: inventory.SourceSysfs,
			Healthy: false, Source: inventory.SourceSysfs,
			VFs: []inventory.VF{{BusID: "0000:d8:00.2"}, {BusID: "0000:d8:00.3", NUMANode: int64p(0), NUMASource: inventory.SourceDeviceCR}}},
		inventory.Device{Type: "gpu", BusID: "0000:af:00.0", Source: inventory.SourceSysfs, Healthy: true},
	)
	code, out, errOut := runCmd(t, "--inventory", "--state-dir", dir)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if first := strings.SplitN(out, "\n", 2)[0]; first != "Node inventory, written by serve 90s ago to "+filepath.Join(dir, "inventory.json")+" (sources: device-cr, sysfs):" {
		t.Errorf("first line %q", first)
	}
	tabletest.EqualRows(t, "inventory", tabletest.Rows(t, strings.SplitN(out, "\n", 2)[1]),
		"gpu GPU-aaa 0000:3b:00.0 - 0 from sysfs device-cr true 2 0 nvidia",
		"gpu <none> 0000:af:00.0 - unknown (device from sysfs) sysfs true - - <none>",
		"rdma 0000:d8:00.0 0000:d8:00.0 - 1 from sysfs sysfs false - - <none>",
		"rdma 0000:d8:00.2 0000:d8:00.2 0000:d8:00.0 1 from sysfs sysfs false - - <none>",
		"rdma 0000:d8:00.3 0000:d8:00.3 0000:d8:00.0 0 from device-cr sysfs false - - <none>",
	)

	code, out, _ = runCmd(t, "--inventory", "--state-dir", dir, "-o", "json")
	var published publish.File
	if err := json.Unmarshal([]byte(out), &published); code != 0 || err != nil {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	if published.Version != 1 || len(published.Devices) != 3 || published.Devices[1].VFs[1].NUMASource != inventory.SourceDeviceCR {
		t.Errorf("inspect --inventory -o json = %+v", published)
	}
}

func TestInspectInventoryFailsWithoutTheFileAndTakesNoPod(t *testing.T) {
	dir := newStateDir(t)
	code, out, errOut := runCmd(t, "--inventory", "--state-dir", dir)
	if code != 1 || out != "" || !strings.Contains(errOut, filepath.Join(dir, "inventory.json")+": no inventory file") {
		t.Errorf("missing inventory file: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut := runCmd(t, "--inventory", "ml/train-0", "--state-dir", dir); code != 2 {
		t.Errorf("--inventory with a pod: exit %d, stderr %q; want a usage error", code, errOut)
	}
}

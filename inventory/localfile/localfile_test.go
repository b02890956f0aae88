package localfile

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/test/inventorytest"
)

// documentedExample returns the first JSON block of docs/inventory.md, so
// that the documented format is the tested one.
func documentedExample(t testing.TB) []byte {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "inventory.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```json\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/inventory.md has no ```json block")
	}
	return []byte(block)
}

func TestParseFileReadsTheDocumentedExample(t *testing.T) {
	devices, err := Parse(documentedExample(t))
	if err != nil {
		t.Fatal(err)
	}
	inventorytest.EqualLines(t, "devices", inventorytest.DescribeAll(devices), []string{
		"gpu id=" + inventorytest.GPU0 + " vendor=nvidia minor=2 index=0 bus=0000:3b:00.0 numa=0 healthy=true vfs=[] source=",
		"gpu id=" + inventorytest.GPU1 + " vendor=nvidia minor=0 index=1 bus=0000:af:00.0 numa=1 healthy=false vfs=[] source=",
		"rdma id=0000:d8:00.0 vendor= minor=0 index=? bus=0000:d8:00.0 numa=1 healthy=true vfs=[0000:d8:00.2@? 0000:d8:00.3@1] source=",
		"fpga id=fpga-0 vendor= minor=? index=? bus=0000:5e:00.0 numa=? healthy=true vfs=[] source=",
	})
}

func TestParseFileWritesPCIAddressesInSysfsForm(t *testing.T) {
	devices, err := Parse([]byte(`{"devices":[{"type":"rdma","id":"0000:D8:00.0","vfs":[{"busID":"00000000:D8:00.2"}]},
		{"type":"gpu","id":"GPU-x","busID":"3b:00.0"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	inventorytest.EqualLines(t, "devices", inventorytest.DescribeAll(devices), []string{
		"rdma id=0000:d8:00.0 vendor= minor=? index=? bus=0000:d8:00.0 numa=? healthy=true vfs=[0000:d8:00.2@?] source=",
		"gpu id=GPU-x vendor= minor=? index=? bus=0000:3b:00.0 numa=? healthy=true vfs=[] source=",
	})
}

func TestParseFileRejectsMistakesWithAMessageSayingWhere(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"syntax error", "{\n  \"devices\": [\n    {\"type\": \"gpu\",, }\n]}", "line 3"},
		{"unknown field", `{"devices":[{"type":"gpu","id":"GPU-1","numa":0}]}`, `unknown field "numa"`},
		{"wrong type", `{"devices":[{"type":"gpu","id":"GPU-1","numaNode":"0"}]}`, "numaNode"},
		{"second value", `{"devices":[]} {"devices":[]}`, "after the inventory object"},
		{"future version", `{"version":2,"devices":[]}`, "unsupported version 2"},
		{"no type", `{"devices":[{"id":"GPU-1"}]}`, "devices[0].type"},
		{"upper-case type", `{"devices":[{"type":"GPU","id":"GPU-1"}]}`, "devices[0].type"},
		{"no id nor busID", `{"devices":[{"type":"gpu","numaNode":0}]}`, "devices[0]: needs an id or a busID"},
		{"bad busID", `{"devices":[{"type":"gpu","id":"GPU-1","busID":"3b:00"}]}`, `devices[0].busID "3b:00"`},
		{"bad VF", `{"devices":[{"type":"rdma","id":"0000:d8:00.0","vfs":[{"busID":"eth0"}]}]}`, `devices[0].vfs[0].busID "eth0"`},
		{"duplicate id", `{"devices":[{"type":"gpu","id":"GPU-1"},{"type":"gpu","id":"gpu-1"}]}`, `devices[1].id: "gpu-1" is already used by devices[0].id`},
		{"VF is another device", `{"devices":[{"type":"rdma","id":"0000:d8:00.0","vfs":[{"busID":"0000:d8:00.2"}]},{"type":"rdma","id":"0000:D8:00.2"}]}`, "already used by devices[0].vfs[0].busID"},
		{"not an object", `[]`, "cannot unmarshal array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse() error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestFileSourceReloadsTheFileWhenItChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.json")
	inventorytest.WriteFile(t, path, `{"devices":[{"type":"gpu","id":"GPU-1","numaNode":0}]}`)
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{New(path, 0)}, Logger: logrus.New()})
	inv.Refresh(context.Background())
	if got := inv.Snapshot().Topology("GPU-1"); len(got) != 1 || got[0] != 0 {
		t.Fatalf("Topology(GPU-1) = %v, want [0]", got)
	}

	changed := inv.Changed()
	inventorytest.WriteFile(t, path, `{"devices":[{"type":"gpu","id":"GPU-1","numaNode":1},{"type":"gpu","id":"GPU-2"}]}`)
	inv.Refresh(context.Background())
	select {
	case <-changed:
	default:
		t.Fatal("the snapshot did not change after the file did")
	}
	inventorytest.EqualLines(t, "devices", inventorytest.DescribeAll(inv.Snapshot().Devices()), []string{
		"gpu id=GPU-1 vendor= minor=? index=? bus= numa=1 healthy=true vfs=[] source=file",
		"gpu id=GPU-2 vendor= minor=? index=? bus= numa=? healthy=true vfs=[] source=file",
	})
}

func TestFileSourceKeepsTheLastGoodInventoryWhenTheFileIsMalformed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.json")
	inventorytest.WriteFile(t, path, `{"devices":[{"type":"gpu","id":"GPU-1","numaNode":0}]}`)
	log, hook := inventorytest.QuietLogger()
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{New(path, 0)}, Logger: log})
	inv.Refresh(context.Background())
	good := inv.Snapshot()

	inventorytest.WriteFile(t, path, "{\"devices\": [\n{\"type\": \"gpu\", \"id\": \"GPU-1\", \"numaNode\": 0,}]}")
	inv.Refresh(context.Background())
	inv.Refresh(context.Background()) // the same error is logged once
	if inv.Snapshot() != good {
		t.Errorf("a malformed file replaced the inventory: %q", inventorytest.DescribeAll(inv.Snapshot().Devices()))
	}
	errs := inventorytest.EntriesAt(hook, logrus.ErrorLevel)
	if len(errs) != 1 || !strings.Contains(errs[0], path) || !strings.Contains(errs[0], "line 2") || !strings.Contains(errs[0], "last good") {
		t.Errorf("errors logged = %q, want one naming the file, the line and that the last good answer is kept", errs)
	}

	inventorytest.WriteFile(t, path, `{"devices":[{"type":"gpu","id":"GPU-1","numaNode":1}]}`)
	inv.Refresh(context.Background())
	if got := inv.Snapshot().Topology("GPU-1"); len(got) != 1 || got[0] != 1 {
		t.Errorf("after the fix Topology(GPU-1) = %v, want [1]", got)
	}
	if infos := inventorytest.EntriesAt(hook, logrus.InfoLevel); !strings.Contains(strings.Join(infos, "\n"), "answers again") {
		t.Errorf("no recovery logged; info lines: %q", infos)
	}
}

func TestFileSourceMissingFileMeansNoDevices(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.json")
	inventorytest.WriteFile(t, path, `{"devices":[{"type":"gpu","id":"GPU-1"}]}`)
	log, hook := inventorytest.QuietLogger()
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{New(path, 0)}, Logger: log})
	inv.Refresh(context.Background())
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	inv.Refresh(context.Background())
	if n := len(inv.Snapshot().Devices()); n != 0 {
		t.Errorf("%d devices after the file was removed, want 0", n)
	}
	if errs := inventorytest.EntriesAt(hook, logrus.ErrorLevel); len(errs) != 0 {
		t.Errorf("a missing file was logged as an error: %q", errs)
	}
	if infos := strings.Join(inventorytest.EntriesAt(hook, logrus.InfoLevel), "\n"); !strings.Contains(infos, "does not exist") {
		t.Errorf("info lines %q do not say the file does not exist", infos)
	}
}

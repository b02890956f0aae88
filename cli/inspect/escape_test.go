package inspect

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// evilID is a device id a tenant could write in an annotation: it turns an
// operator's terminal red and moves the cursor.
const evilID = "GPU-\x1b[31mEVIL\x1b[2A"

func assertEscaped(t *testing.T, what, out string) {
	t.Helper()
	if strings.Contains(out, "\x1b") {
		t.Errorf("%s printed a raw ESC:\n%q", what, out)
	}
	if !strings.Contains(out, `GPU-\x1b[31mEVIL\x1b[2A`) {
		t.Errorf("%s does not show the id escaped:\n%q", what, out)
	}
}

func TestInspectEscapesDeviceIDsForTheTerminal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := state.Open(dir, state.Options{Decoder: gpuDecoder{}})
	if err != nil {
		t.Fatal(err)
	}
	s.ObserveSandbox(record.OriginNRI, model.Sandbox{ID: "sb1", UID: "uid-1", Namespace: "ml", Name: "evil",
		Annotations: map[string]string{"example.com/gpu": evilID}, Ready: true})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd(t, "--state-dir", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	assertEscaped(t, "inspect", out)
}

package credfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadReturnsASmallFileAndRefusesALargeOne(t *testing.T) {
	dir := t.TempDir()
	small, large := filepath.Join(dir, "token"), filepath.Join(dir, "huge")
	if err := os.WriteFile(small, []byte("sekret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(large, make([]byte, MaxSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(small); err != nil || string(b) != "sekret" {
		t.Errorf("Read(small) = %q, %v", b, err)
	}
	if _, err := Read(large); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("Read(a file of MaxSize+1 bytes) = %v, want it refused", err)
	}
	if _, err := Read(filepath.Join(dir, "none")); !os.IsNotExist(err) {
		t.Errorf("Read(a missing file) = %v, want not-exist", err)
	}
}

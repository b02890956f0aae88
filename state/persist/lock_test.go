package persist

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/fulldisk"
)

func TestStartsOnAFullDiskWithoutThePIDInTheLockFile(t *testing.T) {
	disk := fulldisk.Mount(t)
	dir := filepath.Join(disk, "state")
	if err := os.MkdirAll(filepath.Join(dir, podsDirName), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, lockFileName), nil, 0o640); err != nil {
		t.Fatal(err)
	}
	defer fulldisk.Fill(t, disk, false)()
	log, hook := logtest.NewNullLogger()
	w, _, err := Open(dir, Options{Log: log})
	if err != nil {
		t.Fatalf("Open on a disk too full for the pid: %v", err)
	}
	w.Start(noRecords, nil)
	defer w.Close()
	said := ""
	for _, e := range hook.AllEntries() {
		said += e.Message + "\n"
	}
	if !strings.Contains(said, "without the pid") {
		t.Errorf("the failed pid write was not reported: %q", said)
	}
}

func TestASecondWriterIsRefusedWithThePIDOfTheFirst(t *testing.T) {
	dir := t.TempDir()
	quiet, _ := logtest.NewNullLogger()
	w, _, err := Open(dir, Options{Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	w.Start(noRecords, nil)
	defer w.Close()
	_, _, err = Open(dir, Options{Log: quiet})
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second Open: %v, want ErrInUse naming pid %d", err, os.Getpid())
	}
}

func TestALockFilePlantedAsASymlinkIsNotFollowed(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(target, []byte("root's precious file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, lockFileName)); err != nil {
		t.Fatal(err)
	}
	_, _, err := Open(dir, Options{Log: logrus.New()})
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("Open with a lock file planted as a symlink: %v, want an error about the link", err)
	}
	if got, _ := os.ReadFile(target); string(got) != "root's precious file\n" {
		t.Errorf("the symlink's target was touched: %q", got)
	}
}

func noRecords(string) (*record.Record, bool) { return nil, false }

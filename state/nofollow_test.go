package state

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/persist"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/fulldisk"
)

// plantSymlink makes name in dir a symbolic link to a file outside dir
// holding content, and returns the target's path.
func plantSymlink(t *testing.T, dir, name, content string) string {
	t.Helper()
	target := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(target, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	return target
}

func assertUntouched(t *testing.T, target, content string) {
	t.Helper()
	got, err := os.ReadFile(target)
	if err != nil || string(got) != content {
		t.Fatalf("the symlink's target was touched: %q, %v (want %q)", got, err, content)
	}
}

func TestALockFilePlantedAsASymlinkIsNotFollowed(t *testing.T) {
	dir := t.TempDir()
	target := plantSymlink(t, dir, lockFileName, "root's precious file\n")
	s, err := Open(dir, Options{Log: quietLog()})
	if err == nil {
		s.Close()
		t.Fatal("Open followed a lock file planted as a symlink")
	}
	if !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("error does not say why: %v", err)
	}
	assertUntouched(t, target, "root's precious file\n")
}

func TestDirectoriesPlantedAsSymlinksAreRefused(t *testing.T) {
	for _, sub := range []string{podsDirName, corruptDirName} {
		t.Run(sub, func(t *testing.T) {
			dir := t.TempDir()
			elsewhere := t.TempDir()
			if err := os.Symlink(elsewhere, filepath.Join(dir, sub)); err != nil {
				t.Fatal(err)
			}
			s, err := Open(dir, Options{Log: quietLog()})
			if err == nil {
				s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
				s.Close()
				t.Fatalf("Open used %s planted as a symlink", sub)
			}
			if !strings.Contains(err.Error(), "symbolic link") {
				t.Errorf("error does not say why: %v", err)
			}
			if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
				t.Errorf("files were written through the symlink: %v", entries)
			}
			if sub == podsDirName {
				if _, errs := persist.ReadDir(dir); len(errs) != 1 || !strings.Contains(errs[0].Error(), "symbolic link") {
					t.Errorf("ReadDir of a symlinked pods directory: %v, want one error about the link", errs)
				}
			}
		})
	}
}

func TestARecordPlantedAsASymlinkIsSetAsideUnread(t *testing.T) {
	dir := t.TempDir()
	rec := sampleRecord()
	data, err := encodeRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	name := rec.UID + recordExt
	target := plantSymlink(t, dir, filepath.Join(podsDirName, name), string(data))
	if _, errs := persist.ReadDir(dir); len(errs) != 1 || !strings.Contains(errs[0].Error(), "symbolic link") {
		t.Errorf("ReadDir of a symlinked record: %v, want one error about the link", errs)
	}
	s := openTest(t, dir, Options{})
	if _, ok := s.Get(rec.UID); ok {
		t.Error("the store loaded a record through a symlink")
	}
	if _, err := os.Lstat(filepath.Join(dir, podsDirName, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the symlinked record was not set aside: %v", err)
	}
	s.Close()
	assertUntouched(t, target, string(data))
}

func TestANewStateDirectoryOnAFullDiskServesFromMemoryAndWritesOnceThereIsRoom(t *testing.T) {
	// A new node whose disk is full: the records' directory cannot be
	// created. The daemon must start and keep what it learns, and write it
	// all once there is room, as the kubelet and containerd start anyway.
	disk := fulldisk.Mount(t)
	dir := filepath.Join(disk, "state")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	// On ext4 a full disk still creates an empty file (the lock) but no
	// directory, which takes a block; a tmpfs needs no block for either,
	// so the lock file is made first and then the inodes taken too.
	if err := os.WriteFile(filepath.Join(dir, lockFileName), nil, 0o640); err != nil {
		t.Fatal(err)
	}
	free := fulldisk.Fill(t, disk, true)
	s := openTest(t, dir, Options{})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	if err := s.Flush(context.Background()); !errors.Is(err, syscall.ENOSPC) && (err == nil || !strings.Contains(err.Error(), "no space")) {
		t.Fatalf("Flush on a full disk: %v, want ENOSPC", err)
	}
	if _, ok := s.Snapshot().Live(model.PodKey{Namespace: "ns", Name: "a"}); !ok {
		t.Fatal("the pod learned on a full disk is not known")
	}
	free()
	flush(t, s)
	if got := readRecordFile(t, dir, "u1"); got.SandboxID != "sb1" {
		t.Errorf("record written once there was room: sandbox %q, want sb1", got.SandboxID)
	}
}

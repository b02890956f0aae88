package podlogs

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

var db0 = model.PodKey{Namespace: "db", Name: "db-0"}

func mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestTheNewestEntryOfARecreatedNameIsItsNewPod(t *testing.T) {
	root := t.TempDir()
	d := New(root, later())
	mkdir(t, filepath.Join(root, "db_db-0_uid-old"))
	read := stamp(t, d) // the /pods read that saw the old pod
	// Force-deleted and recreated: the kubelet makes the new pod's
	// directory while the old one's is still there.
	mkdir(t, filepath.Join(root, "db_db-0_uid-new"))
	names := NewNameReader(d).Read(context.Background(), stamp(t, d))
	if err := names.err; err != nil {
		t.Fatal(err)
	}
	for _, since := range []Stamp{read, {}} {
		// Two entries made in one tick of the coarse clock cannot be
		// told apart: doubt, never the old pod.
		if uid, doubt := names.NewestAfter(db0, since, time.Time{}); uid != "uid-new" && !doubt {
			t.Errorf("since %+v: the name is %q (doubt %v), want uid-new or doubt, never uid-old", since, uid, doubt)
		}
	}
	if uid, doubt := names.NewestAfter(model.PodKey{Namespace: "db", Name: "db-1"}, read, time.Time{}); uid != "" || doubt {
		t.Errorf("a name with no entry is %q (doubt %v), want nothing", uid, doubt)
	}
}

func TestOnlyThePodDirectoriesOfTheKubeletAreNames(t *testing.T) {
	root := t.TempDir()
	d := New(root, later())
	elsewhere := t.TempDir()
	mkdir(t, filepath.Join(elsewhere, "db_db-0_uid-link"))
	if err := os.Symlink(filepath.Join(elsewhere, "db_db-0_uid-link"), filepath.Join(root, "db_db-0_uid-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "db_db-0_uid-file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(root, "db_db-0_uid_extra"))
	mkdir(t, filepath.Join(root, "db_db-0"))
	names := NewNameReader(d).Read(context.Background(), stamp(t, d))
	if uid, doubt := names.NewestAfter(db0, Stamp{}, time.Time{}); uid != "" || doubt {
		t.Errorf("a link, a file and malformed names give db-0 %q (doubt %v), want nothing", uid, doubt)
	}
}

func TestADirectoryThatCannotBeReadLeavesEveryNameInDoubt(t *testing.T) {
	root := t.TempDir()
	d := New(root, later())
	now := stamp(t, d)
	if err := os.Remove(root); err != nil {
		t.Fatal(err)
	}
	names := NewNameReader(d).Read(context.Background(), now)
	if names.err == nil {
		t.Fatal("a directory that is gone was read")
	}
	if _, doubt := names.NewestAfter(db0, now, time.Time{}); !doubt {
		t.Error("a directory that could not be read says something of db-0, want doubt")
	}
}

func TestTheEntriesAreReadOncePerChangeForEveryQuery(t *testing.T) {
	root := t.TempDir()
	d := New(root, later())
	r := NewNameReader(d)
	mkdir(t, filepath.Join(root, "db_db-0_uid-old"))
	first := r.Read(context.Background(), stamp(t, d))
	// A steady node: however many queries, the directory is not read again.
	for range 5 {
		if again := r.Read(context.Background(), stamp(t, d)); again != first {
			t.Fatal("the directory was read again while it was unchanged")
		}
	}
	// A sandbox begins: the queries that find the change share one read.
	mkdir(t, filepath.Join(root, "db_db-0_uid-new"))
	now := stamp(t, d)
	got := make([]*Names, 8)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i] = r.Read(context.Background(), now) })
	}
	wg.Wait()
	for i, n := range got {
		if n == first {
			t.Fatalf("query %d got the read from before the change", i)
		}
		if n != got[0] {
			t.Errorf("queries 0 and %d got reads of their own, want one shared", i)
		}
	}
}

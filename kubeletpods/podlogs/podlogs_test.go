package podlogs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

// ahead is a clock Settle and a second ahead of the real one: a stamp it
// takes is Settle past any change made before, however long a test runs,
// so that no test waits for Settle.
type ahead struct{}

func (ahead) Now() time.Time                    { return time.Now().Add(Settle + time.Second) }
func (a ahead) Since(t time.Time) time.Duration { return a.Now().Sub(t) }

func later() ahead { return ahead{} }

func stamp(t *testing.T, d *Dir) Stamp {
	t.Helper()
	s, err := d.Stamp()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestASandboxBegunAfterAStampChangesIt(t *testing.T) {
	root := t.TempDir()
	d := New(root, later())
	before := stamp(t, d)
	if !before.Unchanged(stamp(t, d)) {
		t.Fatal("nothing was added, yet the stamps differ")
	}
	// The kubelet begins a sandbox: the pod's log directory comes first.
	if err := os.Mkdir(filepath.Join(root, "ml_web-0_uid-2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if before.Unchanged(stamp(t, d)) {
		t.Error("a pod's log directory was made since the stamp, yet it says no sandbox began")
	}
	// Log garbage collection counts too: the safe side.
	after := stamp(t, d)
	if err := os.Remove(filepath.Join(root, "ml_web-0_uid-2")); err != nil {
		t.Fatal(err)
	}
	if after.Unchanged(stamp(t, d)) {
		t.Error("a pod's log directory was removed since the stamp, yet it says nothing changed")
	}
}

func TestAStampTakenRightAfterAChangeSaysNothing(t *testing.T) {
	// ctime comes from a coarse clock (and whole seconds on some
	// filesystems): a second change in the same tick would not show.
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "ml_web-0_uid-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := stamp(t, New(root, nil)) // the real clock, right after the change
	if s.Unchanged(s) {
		t.Error("a stamp taken within Settle of the directory's change trusts it")
	}
	s2 := stamp(t, New(root, later()))
	if s.Same(s2) {
		t.Error("a settled and an unsettled stamp of the same directory are the Same: the store would keep the unsettled one")
	}
}

func TestStampsOfAnotherDirectoryOrNoneSayNothing(t *testing.T) {
	a, b := New(t.TempDir(), later()), New(t.TempDir(), later())
	if stamp(t, a).Unchanged(stamp(t, b)) {
		t.Error("stamps of two directories agree")
	}
	var none *Dir
	if s := stamp(t, none); s.Unchanged(s) {
		t.Error("no directory's stamp says something")
	}
	if _, err := New(filepath.Join(t.TempDir(), "absent"), nil).Stamp(); err == nil {
		t.Error("a missing directory gives no error")
	}
	if (Stamp{}).Unchanged(Stamp{}) {
		t.Error("zero stamps agree")
	}
}

func TestCheckRefusesADirectoryWithoutTheRunningPodsLogs(t *testing.T) {
	root := t.TempDir()
	d := New(root, later())
	running := model.KubeletPod{UID: "uid-1", Namespace: "ml", Name: "web-0", Phase: "Running"}
	pending := model.KubeletPod{UID: "uid-2", Namespace: "ml", Name: "stuck", Phase: "Pending"}

	// No pod runs: nothing shows the directory is the kubelet's.
	s, err := d.Check(stamp(t, d), []model.KubeletPod{pending})
	if err != nil || s.Unchanged(s) {
		t.Errorf("with no running pod: %v, stamp trusted %v; want a stamp that says nothing, no error", err, s.Unchanged(s))
	}
	// A running pod whose directory is not there: not the kubelet's.
	s, err = d.Check(stamp(t, d), []model.KubeletPod{running, pending})
	if err == nil || !strings.Contains(err.Error(), "ml/web-0") || s.Unchanged(s) {
		t.Errorf("without the running pod's directory: %v, stamp trusted %v; want an error naming ml/web-0", err, s.Unchanged(s))
	}
	if err := os.Mkdir(filepath.Join(root, "ml_web-0_uid-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err = d.Check(stamp(t, d), []model.KubeletPod{running, pending})
	if err != nil || !s.Unchanged(stamp(t, d)) {
		t.Errorf("with the running pod's directory: %v, stamp trusted %v; want it trusted", err, s.Unchanged(s))
	}
	// The kubelet's podLogsDir moved: the old directory still holds the
	// older pods' logs, not those of a pod started since.
	newer := model.KubeletPod{UID: "uid-3", Namespace: "ml", Name: "web-1", Phase: "Running"}
	s, err = d.Check(stamp(t, d), []model.KubeletPod{running, running, running, newer})
	if err == nil || !strings.Contains(err.Error(), "ml/web-1") || s.Unchanged(s) {
		t.Errorf("without the newest running pod's directory: %v, stamp trusted %v; want an error naming ml/web-1", err, s.Unchanged(s))
	}
}

func TestCheckTakesAPodDeletedSinceTheReadForNoSignOfAWrongDirectory(t *testing.T) {
	root := t.TempDir()
	d := New(root, later())
	kept := model.KubeletPod{UID: "uid-1", Namespace: "ml", Name: "web-0", Phase: "Running"}
	deleted := model.KubeletPod{UID: "uid-2", Namespace: "ml", Name: "web-1", Phase: "Running"}
	for _, p := range []model.KubeletPod{kept, deleted} {
		if err := os.Mkdir(filepath.Join(root, p.Namespace+"_"+p.Name+"_"+p.UID), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	before := stamp(t, d)
	// The read listed both; the kubelet then deleted web-1 and its logs.
	if err := os.Remove(filepath.Join(root, "ml_web-1_uid-2")); err != nil {
		t.Fatal(err)
	}
	// A coarse clock may stamp the removal as the last change before:
	// change the directory until its ctime moves, as time makes it.
	for stamp(t, d).ctime == before.ctime {
		if err := os.Mkdir(filepath.Join(root, "tick"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(root, "tick")); err != nil {
			t.Fatal(err)
		}
	}
	if s, err := d.Check(before, []model.KubeletPod{kept, deleted}); err != nil || !s.ok {
		t.Errorf("a pod deleted since the read: %v, stamp known %v; want no alarm, the stamp kept", err, s.ok)
	}
}

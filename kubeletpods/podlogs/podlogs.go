// Package podlogs tells, from the kubelet's pod logs directory, whether the
// kubelet may have begun a pod sandbox since a moment: what lets a /pods
// read answer a pod that is not running until the kubelet starts one; and,
// from its entries, which UID each pod name is now (names.go), which tells
// a running pod from a successor recreated under its name.
//
// Why. PodResources names pods without a UID, so without the Pods API's
// watch only a /pods read says which pod a name is now. A pod that is not
// running (stuck before its sandbox on a missing Secret, or finished) could
// have been deleted and recreated under its name since the last read, with
// other devices: a query about it must be answered from a read that started
// after the query arrived, which costs a /pods read per List for as long as
// such a pod stays (and fails every List while /pods is down). Yet the one
// query that must not get a predecessor's devices, Multus's or Kata's,
// comes while the kubelet creates the pod's sandbox, and the kubelet makes
// the pod's log directory, <dir>/<namespace>_<name>_<uid>, just before it
// asks the runtime for the sandbox (kuberuntime's createPodSandbox, every
// release since the CRI). Adding an entry changes the directory's ctime, so
// a read taken while the ctime stays what it was before the read began
// still says which pod every name not running is, for as long as it stays.
//
// Limits, each on the safe side (the read is then made):
//   - Any entry added or removed anywhere on the node (any pod's sandbox,
//     the kubelet's log garbage collection) counts: one read, not one per
//     pod.
//   - Timestamps come from a coarse clock, and some filesystems keep whole
//     seconds: a ctime within Settle before the stamp was taken cannot
//     rule out a second change stamped alike, so such a stamp says nothing.
//   - A directory that is not the kubelet's (a wrong --kubelet-pod-logs-dir,
//     a path not mounted into the daemon's container, one the kubelet left
//     when its podLogsDir changed) never changes: Check refuses a stamp
//     unless the directory of every running pod is in it, so one pod
//     started since is enough to tell. Replacing the directory itself under
//     a running daemon (its mount keeps the old one) is not told apart
//     until a pod starts: restart the daemon after doing so.
//   - A pod deleted and recreated before its sandbox, the successor not
//     running either, is answered with its predecessor's devices until the
//     successor's sandbox begins (or any read): a name not running has no
//     network and no process a device could reach.
package podlogs

import (
	"fmt"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"

	"github.com/podres-proxy/podres-proxy/model"
)

// DefaultDir is the kubelet's default podLogsDir.
const DefaultDir = "/var/log/pods"

// Settle is how long after the directory's last change a stamp must be
// taken to tell a later change from it (see the package doc): whole
// seconds of ctime, and a coarse clock, are both well within it.
const Settle = 2 * time.Second

// Dir is the kubelet's pod logs directory. A nil *Dir is none: its
// stamps say nothing.
type Dir struct {
	path  string
	clock clock.PassiveClock
}

// New returns the Dir at path, nil when path is empty. clk tells when a
// stamp is taken; nil means the real clock.
func New(path string, clk clock.PassiveClock) *Dir {
	if path == "" {
		return nil
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Dir{path: filepath.Clean(path), clock: clk}
}

// Stamp is the directory's state at one moment. Its zero value says
// nothing: Unchanged is false for it.
type Stamp struct {
	ok       bool
	dev, ino uint64
	ctime    int64     // nanoseconds since the epoch
	at       time.Time // when the stamp was taken (before the stat)
}

// Stamp stats the directory now; a directory it cannot stat gives a stamp
// that says nothing, and its error.
func (d *Dir) Stamp() (Stamp, error) {
	if d == nil {
		return Stamp{}, nil
	}
	at := d.clock.Now()
	var st unix.Stat_t
	if err := unix.Stat(d.path, &st); err != nil {
		return Stamp{}, fmt.Errorf("pod logs directory %s: %w", d.path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return Stamp{}, fmt.Errorf("pod logs directory %s is not a directory", d.path)
	}
	return Stamp{ok: true, dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim.Nano(), at: at}, nil
}

// Check returns s when the directory of every running pod of pods is in d
// (the kubelet made each before its sandbox), and otherwise a stamp that
// says nothing, with the reason: d is not where this kubelet keeps pod
// logs, or no pod runs to show that it is. A pod whose directory is
// missing from a directory that changed since s says neither: it may have
// been deleted since the read (under churn, often). Every one, not a few: the
// oldest pods' directories are also in a directory the kubelet stopped
// writing to, and the newest show that it did (one lstat each, beside a
// read of every pod).
func (d *Dir) Check(s Stamp, pods []model.KubeletPod) (Stamp, error) {
	if d == nil || !s.ok {
		return Stamp{}, nil
	}
	n := 0
	for i := range pods {
		p := &pods[i]
		if p.Phase != "Running" || p.UID == "" {
			continue
		}
		dir := filepath.Join(d.path, p.Namespace+"_"+p.Name+"_"+p.UID)
		var st unix.Stat_t
		if err := unix.Lstat(dir, &st); err != nil {
			if d.changedSince(s) {
				// The pod may have been deleted since the read, and
				// its directory removed: that says nothing.
				continue
			}
			return Stamp{}, fmt.Errorf("pod logs directory %s does not hold running pod %s/%s's logs (%s): not the kubelet's podLogsDir?: %w",
				d.path, p.Namespace, p.Name, dir, err)
		}
		n++
	}
	if n == 0 {
		return Stamp{}, nil // nothing shows it is the kubelet's: next read
	}
	return s, nil
}

// changedSince reports whether an entry was added to or removed from the
// directory since s was taken, or it cannot be told.
func (d *Dir) changedSince(s Stamp) bool {
	now, err := d.Stamp()
	return err != nil || now.dev != s.dev || now.ino != s.ino || now.ctime != s.ctime
}

// settled reports whether s was taken Settle or more after the change
// before it.
func (s Stamp) settled() bool { return s.at.Sub(time.Unix(0, s.ctime)) >= Settle }

// Same reports whether s and o say the same: the same directory, unchanged
// between them, each settled or each not (the times they were taken aside).
func (s Stamp) Same(o Stamp) bool {
	if !s.ok || !o.ok {
		return s.ok == o.ok
	}
	return s.dev == o.dev && s.ino == o.ino && s.ctime == o.ctime && s.settled() == o.settled()
}

// Unchanged reports whether later, a stamp of the same directory, shows
// that no entry was added or removed since s was taken, s having been taken
// long enough after the change before it (Settle): no pod sandbox can have
// begun in between.
func (s Stamp) Unchanged(later Stamp) bool {
	return s.ok && later.ok && s.dev == later.dev && s.ino == later.ino && s.ctime == later.ctime && s.settled()
}

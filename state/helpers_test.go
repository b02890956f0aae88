package state

import (
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/internal/atomicfile"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// The state directory's layout (package persist) and its file format
// (package record), as the tests look at them.
const (
	podsDirName    = "pods"
	corruptDirName = "corrupt"
	lockFileName   = "lock"
	recordExt      = record.Ext
)

func isTempName(name string) bool { return atomicfile.IsTemp(name) }

var (
	encodeRecord = record.Encode
	decodeRecord = record.Decode
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *fakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// fakeDecoder decodes "alloc/<type>" annotations whose value is a comma
// separated list of device ids into devices of resource <prefix>/<type>.
// The value "bad" is an annotation it cannot understand. It counts calls.
type fakeDecoder struct {
	prefix string

	mu    sync.Mutex
	calls int
}

func (d *fakeDecoder) Relevant(key string) bool { return strings.HasPrefix(key, "alloc/") }

// MaxAnnotationBytes bounds alloc/hint as Koordinator's hint is bounded,
// the other keys as allocations are.
func (d *fakeDecoder) MaxAnnotationBytes(key string) int {
	switch {
	case key == "alloc/hint":
		return 4 << 10
	case d.Relevant(key):
		return 64 << 10
	}
	return 0
}

func (d *fakeDecoder) Decode(_ model.PodRef, ann map[string]string) ([]model.Device, []error) {
	d.mu.Lock()
	d.calls++
	d.mu.Unlock()
	var devs []model.Device
	var errs []error
	for k, v := range ann {
		typ := strings.TrimPrefix(k, "alloc/")
		if v == "bad" {
			errs = append(errs, errors.New("cannot decode "+k))
			continue
		}
		prefix := d.prefix
		if prefix == "" {
			prefix = "example.com"
		}
		devs = append(devs, model.Device{Allocator: "fake", Type: typ, Resource: prefix + "/" + typ, IDs: strings.Split(v, ",")})
	}
	return devs, errs
}

func (d *fakeDecoder) Calls() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls
}

// quietLog keeps expected warnings out of the test output.
func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// capturedLog records log entries so that tests can check what was said.
type capturedLog struct {
	mu      sync.Mutex
	entries []string
}

func (c *capturedLog) Levels() []logrus.Level { return logrus.AllLevels }

func (c *capturedLog) Fire(e *logrus.Entry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = append(c.entries, e.Level.String()+": "+e.Message)
	return nil
}

func (c *capturedLog) Text() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.entries, "\n")
}

func newCapturedLog() (*logrus.Logger, *capturedLog) {
	l := logrus.New()
	l.SetOutput(io.Discard)
	c := &capturedLog{}
	l.AddHook(c)
	return l, c
}

func readySandbox(uid, ns, name, id string, ann map[string]string) model.Sandbox {
	return model.Sandbox{ID: id, UID: uid, Namespace: ns, Name: name, Annotations: ann, Ready: true}
}

func mustGet(t *testing.T, s *Store, uid string) *record.Record {
	t.Helper()
	r, ok := s.Get(uid)
	if !ok {
		t.Fatalf("no record for uid %s", uid)
	}
	return r
}

func containerStates(r *record.Record) map[string]model.ContainerState {
	m := map[string]model.ContainerState{}
	for _, c := range r.Containers {
		m[c.ID] = c.State
	}
	return m
}

// sampleRecord is a valid record of a running pod.
func sampleRecord() *record.Record {
	return &record.Record{SchemaVersion: record.SchemaVersion, UID: "0b5d8e3a-1c2f-4b7e-9a6d-2f1e3c4b5a69",
		Namespace: "ml", Name: "trainer-0", SandboxID: "4f1c0d2e9b8a", State: record.PhaseReady}
}

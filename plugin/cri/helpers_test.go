package cri

import (
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/internal/poll"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
)

func testLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	return l
}

// shortTempDir returns a directory for unix sockets: t.TempDir's paths can
// exceed the 108 bytes a socket path may have.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// waitStore waits on the store; on timeout it prints the store.
func waitStore(t testing.TB, s *state.Store, what string, cond func() bool) {
	t.Helper()
	poll.UntilWith(t, what, cond, func() string { return "store:\n" + dump(s) })
}

func dump(s *state.Store) string {
	b, _ := json.MarshalIndent(s.Records(), "", "  ")
	return string(b)
}

// phase returns the phase of a pod, "" when the store has no record of it.
func phase(s *state.Store, uid string) record.Phase {
	if r, ok := s.Get(uid); ok {
		return r.State
	}
	return ""
}

// ctrState returns the state of a container, "" when the store has none.
func ctrState(s *state.Store, uid, id string) model.ContainerState {
	r, ok := s.Get(uid)
	if !ok {
		return ""
	}
	for _, c := range r.Containers {
		if c.ID == id {
			return c.State
		}
	}
	return ""
}

// testDecoder keeps annotations under example.com/ and makes each one a
// device.
type testDecoder struct{}

func newTestDecoder() testDecoder { return testDecoder{} }

func (testDecoder) Relevant(key string) bool { return strings.HasPrefix(key, "example.com/") }

func (testDecoder) Decode(_ model.PodRef, ann map[string]string) ([]model.Device, []error) {
	var devs []model.Device
	for k, v := range ann {
		devs = append(devs, model.Device{Allocator: "test", Resource: k, IDs: []string{v}})
	}
	return devs, nil
}

// testMetrics records what the reconciler reports.
type testMetrics struct {
	mu              sync.Mutex
	reconciles      int
	reconcileErrors int
}

func newTestMetrics() *testMetrics { return &testMetrics{} }

func (m *testMetrics) Reconciled(_ time.Duration, err error) {
	m.mu.Lock()
	m.reconciles++
	if err != nil {
		m.reconcileErrors++
	}
	m.mu.Unlock()
}

func (m *testMetrics) get(f func(m *testMetrics) int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return f(m)
}

package cri

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
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

// testMetrics records what the reconciler reports.
type testMetrics struct {
	mu              sync.Mutex
	reconciles      int
	reconcileErrors int
}

func newTestMetrics() *testMetrics { return &testMetrics{} }

func (m *testMetrics) CRIReconciled(_ time.Duration, err error) {
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

package resolve

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podlogs"
	"github.com/podres-proxy/podres-proxy/metrics"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
)

// NewPodsReader returns the shared /pods reader of fetch, which records every
// read in the store once, however many queries share it: pods seen there
// become pending records with their spec and decoded allocations, which is
// what lets a pod first learned from NRI cost one /pods read, once. Each
// read is recorded with the pod logs directory as it was before the read
// began (logsDir). Nil without fetch.
func NewPodsReader(store *state.Store, fetch kubeletpods.Fetch, logsDir *podlogs.Dir, timeout time.Duration, m *metrics.Metrics, log logrus.FieldLogger) *kubeletpods.Reader {
	if fetch == nil {
		return nil
	}
	var mu sync.Mutex
	var lastErr string // the pod logs directory's, logged when it changes
	record := func(ctx context.Context) ([]model.KubeletPod, error) {
		logs, logsErr := logsDir.Stamp()
		started := time.Now()
		pods, err := fetch(ctx)
		if err != nil {
			return nil, err
		}
		if logsErr == nil {
			logs, logsErr = logsDir.Check(logs, pods)
		}
		mu.Lock()
		if msg := fmt.Sprint(logsErr); logsErr != nil && msg != lastErr {
			log.WithError(logsErr).Warn("Pods not running are read from /pods again for every query")
			lastErr = msg
		} else if logsErr == nil {
			lastErr = ""
		}
		mu.Unlock()
		store.ObserveKubeletPods(started, LogsEvidence{Stamp: logs}, pods)
		return pods, nil
	}
	return kubeletpods.NewReader(record, kubeletpods.ReaderOptions{Timeout: timeout, Metrics: m})
}

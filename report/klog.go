package report

import (
	"context"
	"errors"

	"github.com/go-logr/logr"
	"github.com/sirupsen/logrus"
)

// logSink is the logger client-go's Event recording logs with (through its
// context), onto the daemon's log: its errors (an Event the API server
// refused, a write it retries) as warnings without the whole Event, which
// the daemon's log does not need; the rest at debug level.
type logSink struct {
	log    logrus.FieldLogger
	fields logrus.Fields
}

func (s *logSink) Init(logr.RuntimeInfo) {}

func (s *logSink) Enabled(level int) bool { return level == 0 }

func (s *logSink) Info(_ int, msg string, kv ...any) {
	s.entry(kv).Debug("Events: " + msg)
}

func (s *logSink) Error(err error, msg string, kv ...any) {
	if errors.Is(err, context.Canceled) {
		s.entry(kv).WithError(err).Debug("Events: " + msg) // the daemon stops
		return
	}
	s.entry(kv).WithError(err).Warn("Events: " + msg)
}

func (s *logSink) WithValues(kv ...any) logr.LogSink {
	return &logSink{log: s.log, fields: s.with(kv)}
}

func (s *logSink) WithName(string) logr.LogSink { return s }

// entry is the log entry with the sink's fields and kv, but the Event
// objects client-go passes (pages of text each).
func (s *logSink) entry(kv []any) *logrus.Entry {
	return s.log.WithFields(s.with(kv))
}

func (s *logSink) with(kv []any) logrus.Fields {
	f := logrus.Fields{}
	for k, v := range s.fields {
		f[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		k, ok := kv[i].(string)
		if !ok || k == "event" {
			continue
		}
		f[k] = kv[i+1]
	}
	return f
}

package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	"github.com/sirupsen/logrus"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/inventory/devicecr"
)

// apiConfig is the client-go configuration of --api-server,
// --api-token-file and --api-ca-file: every conversation with the API
// server goes through it (internal/apiclient).
// The first call routes client-go's log to log (routeClientGoLog).
func (c *serveConfig) apiConfig(log logrus.FieldLogger) (*rest.Config, error) {
	routeOnce.Do(func() { routeClientGoLog(log) })
	return apiclient.Config(apiclient.Options{Server: c.apiServer, TokenFile: c.apiTokenFile, CAFile: c.apiCAFile})
}

var routeOnce sync.Once

// deviceCRSource returns the inventory source of the node's Koordinator Device
// object and its watch, which serve runs before the inventory's first
// refresh (the refresh waits for the watch's first list, at most
// devicecr.DefaultTimeout).
func (c *serveConfig) deviceCRSource(log logrus.FieldLogger) (*devicecr.Source, func(context.Context) error, error) {
	cfg, err := c.apiConfig(log)
	if err != nil {
		return nil, nil, err
	}
	src, err := devicecr.New(devicecr.Options{Config: cfg, NodeName: c.nodeName})
	if err != nil {
		return nil, nil, err
	}
	return src, src.Run, nil
}

// noWatch is the watch of an inventory without the Device object.
func noWatch(context.Context) error { return nil }

// routeClientGoLog sends client-go's log (klog) to serve's, at debug level:
// a watch's failures are the reflector's to retry, with its backoff, and
// the sources log what they mean for the answers (the inventory's
// "inventory source failed", the legacy view's list failures) once. Only
// klog's level 0 is kept.
func routeClientGoLog(log logrus.FieldLogger) {
	klog.SetLogger(logr.New(&klogSink{log: log.WithField("component", "client-go")}))
}

// klogSink is a logr.LogSink writing to a logrus logger.
type klogSink struct {
	log logrus.FieldLogger
}

func (s *klogSink) Init(logr.RuntimeInfo)  {}
func (s *klogSink) Enabled(level int) bool { return level == 0 }

func (s *klogSink) Info(_ int, msg string, kv ...any) { s.with(kv).Debug(msg) }

func (s *klogSink) Error(err error, msg string, kv ...any) {
	s.with(kv).WithError(err).Debug(msg)
}

func (s *klogSink) WithValues(kv ...any) logr.LogSink { return &klogSink{log: s.with(kv)} }

func (s *klogSink) WithName(name string) logr.LogSink {
	return &klogSink{log: s.log.WithField("logger", name)}
}

func (s *klogSink) with(kv []any) logrus.FieldLogger {
	fields := logrus.Fields{}
	for i := 0; i+1 < len(kv); i += 2 {
		fields[fmt.Sprint(kv[i])] = kv[i+1]
	}
	return s.log.WithFields(fields)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"

	"github.com/podres-proxy/podres-proxy/internal/apiauth"
	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/internal/servingcert"
	"github.com/podres-proxy/podres-proxy/metrics"
)

// secureMetricsConfig is serve's command line for /metrics over HTTPS, for
// the cluster's Prometheus (docs/metrics.md, "Scraping"): the API server
// decides who may get it.
type secureMetricsConfig struct {
	metricsSecureAddr, metricsCertFile, metricsKeyFile string
}

func (c *secureMetricsConfig) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.metricsSecureAddr, "metrics-secure-addr", "", "address for /metrics over HTTPS, served to callers the API server allows to get /metrics (TokenReview, SubjectAccessReview); e.g. :9478 for the cluster's Prometheus; empty disables")
	fs.StringVar(&c.metricsCertFile, "metrics-cert-file", "", "serving certificate (PEM) of --metrics-secure-addr, read again when it changes; empty with --metrics-key-file: a self-signed certificate made at start")
	fs.StringVar(&c.metricsKeyFile, "metrics-key-file", "", "private key (PEM) of --metrics-cert-file")
}

// check refuses half a certificate pair, or one without the listener.
func (c *secureMetricsConfig) check() error {
	if (c.metricsCertFile == "") != (c.metricsKeyFile == "") {
		return errors.New("--metrics-cert-file and --metrics-key-file go together")
	}
	if c.metricsCertFile != "" && c.metricsSecureAddr == "" {
		return errors.New("--metrics-cert-file needs --metrics-secure-addr")
	}
	return nil
}

// secureMetrics returns the HTTPS /metrics server's run function, or nil
// when --metrics-secure-addr is empty. It fails when the certificate cannot
// be read or the API server cannot be found (not in a pod, no --api-server).
func (c *serveConfig) secureMetrics(reg *prometheus.Registry, log logrus.FieldLogger) (func(context.Context) error, error) {
	if c.metricsSecureAddr == "" {
		return nil, nil
	}
	tlsConfig, err := servingcert.Config(c.metricsCertFile, c.metricsKeyFile, selfSignedHosts())
	if err != nil {
		return nil, fmt.Errorf("--metrics-secure-addr: %w", err)
	}
	cfg, err := apiclient.Config(apiclient.Options{Server: c.apiServer, TokenFile: c.apiTokenFile, CAFile: c.apiCAFile})
	if err != nil {
		return nil, fmt.Errorf("--metrics-secure-addr needs the API server to review its callers: %w", err)
	}
	authz, err := apiauth.New(cfg, apiauth.Options{Log: log})
	if err != nil {
		return nil, fmt.Errorf("--metrics-secure-addr: %w", err)
	}
	if c.metricsCertFile == "" {
		log.Info("--metrics-secure-addr: serving a self-signed certificate (no --metrics-cert-file); scrapers cannot verify it")
	}
	return func(ctx context.Context) error {
		return metrics.ServeSecure(ctx, c.metricsSecureAddr, reg, tlsConfig, authz.Wrap, log)
	}, nil
}

// selfSignedHosts are the names a self-signed certificate is made for: the
// node's name and address (the downward API's) and the host name.
func selfSignedHosts() []string {
	hosts := []string{os.Getenv("NODE_NAME"), os.Getenv("NODE_IP")}
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	return hosts
}

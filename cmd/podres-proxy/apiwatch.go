package main

import (
	"context"

	"k8s.io/client-go/rest"

	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/inventory/devicecr"
)

// apiConfig is the client-go configuration of --api-server,
// --api-token-file and --api-ca-file: every conversation with the API
// server goes through it (internal/apiclient).
func (c *serveConfig) apiConfig() (*rest.Config, error) {
	return apiclient.Config(apiclient.Options{Server: c.apiServer, TokenFile: c.apiTokenFile, CAFile: c.apiCAFile})
}

// deviceCRSource returns the inventory source of the node's Koordinator Device
// object and its watch, which serve runs before the inventory's first
// refresh (the refresh waits for the watch's first list, at most
// devicecr.DefaultTimeout).
func (c *serveConfig) deviceCRSource() (*devicecr.Source, func(context.Context) error, error) {
	cfg, err := c.apiConfig()
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

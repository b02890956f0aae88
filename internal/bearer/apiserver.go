package bearer

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
)

// APIServer returns the API server's URL: server when given, else the one a
// pod finds in its environment (KUBERNETES_SERVICE_HOST and _PORT), checked
// to be an http(s) URL with a host. Every reader of API objects (Koordinator's
// Device object, DRA's ResourceSlices) finds the server this one way.
func APIServer(server string) (string, error) {
	if server == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return "", errors.New("no API server URL given and KUBERNETES_SERVICE_HOST/PORT are not set (not running in a pod?)")
		}
		server = "https://" + net.JoinHostPort(host, port)
	}
	if u, err := url.Parse(server); err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return "", fmt.Errorf("API server URL %q: want https://host:port", server)
	}
	return server, nil
}

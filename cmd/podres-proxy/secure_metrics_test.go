package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// Half a certificate pair, or a certificate without the HTTPS listener, is
// a usage error that names the flags.
func TestSecureMetricsFlagMistakesAreUsageErrors(t *testing.T) {
	const pods = "--kubelet-pods-url=http://127.0.0.1:10255/pods"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", pods, "--metrics-secure-addr=:9478", "--metrics-cert-file=/tls/tls.crt"}, "--metrics-key-file"},
		{[]string{"serve", pods, "--metrics-secure-addr=:9478", "--metrics-key-file=/tls/tls.key"}, "--metrics-cert-file"},
		{[]string{"serve", pods, "--metrics-cert-file=/tls/tls.crt", "--metrics-key-file=/tls/tls.key"}, "--metrics-secure-addr"},
	} {
		var errOut bytes.Buffer
		if code := run(context.Background(), tc.args, io.Discard, &errOut); code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d (%s), want 2 naming %s", tc.args, code, strings.TrimSpace(errOut.String()), tc.want)
		}
	}
}

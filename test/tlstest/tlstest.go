// Package tlstest writes the CA files that tests of TLS clients need: the
// certificate a test server presents, and a CA that signed nothing, to show
// that verification really happens.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http/httptest"
	"os"
	"testing"
	"time"
)

// WriteCert writes a DER certificate as PEM to path.
func WriteCert(t testing.TB, path string, der []byte) string {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ServerCA writes the certificate srv presents (httptest's, self-signed) to
// path, for a client to trust.
func ServerCA(t testing.TB, path string, srv *httptest.Server) string {
	t.Helper()
	return WriteCert(t, path, srv.Certificate().Raw)
}

// OtherCA writes to path a CA certificate that signed nothing a test server
// presents.
func OtherCA(t testing.TB, path string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "some other cluster CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return WriteCert(t, path, der)
}

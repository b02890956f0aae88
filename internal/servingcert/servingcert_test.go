package servingcert

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/test/poll"
)

// serve answers TLS handshakes with cfg on a loopback port and returns its
// address.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return l.Addr().String()
}

// peer returns the certificate addr serves to a client at TLS version v.
func peer(addr string, v uint16) (*x509.Certificate, error) {
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: v, MaxVersion: v})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0], nil
}

func TestWithoutFilesASelfSignedCertificateIsServedOverTLS12AndLater(t *testing.T) {
	cfg, err := Config("", "", []string{"node-1", "10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		cert, err := peer(addr, v)
		if err != nil {
			t.Fatalf("TLS %x: %v", v, err)
		}
		if cert.Subject.CommonName != "podres-proxy" || cert.Issuer.String() != cert.Subject.String() || cert.CheckSignature(cert.SignatureAlgorithm, cert.RawTBSCertificate, cert.Signature) != nil {
			t.Errorf("certificate %v is not self-signed", cert.Subject)
		}
		if len(cert.DNSNames) != 1 || cert.DNSNames[0] != "node-1" || len(cert.IPAddresses) != 1 || !cert.IPAddresses[0].Equal(net.ParseIP("10.0.0.1")) {
			t.Errorf("names %v, addresses %v, want node-1 and 10.0.0.1", cert.DNSNames, cert.IPAddresses)
		}
		if d := time.Until(cert.NotAfter); d < Validity-time.Hour {
			t.Errorf("valid for %s more, want about %s", d, Validity)
		}
	}
	if _, err := peer(addr, tls.VersionTLS11); err == nil {
		t.Error("a TLS 1.1 client was served")
	}
}

func TestASelfSignedCertificateIsMadeAgainBeforeItExpires(t *testing.T) {
	now := time.Now()
	s := &selfSigned{now: func() time.Time { return now }}
	first, err := s.get(nil)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(Validity / 2)
	if c, _ := s.get(nil); c != first {
		t.Error("made again half way through its validity")
	}
	now = first.Leaf.NotAfter.Add(-Validity / 20)
	if c, _ := s.get(nil); c == first || !c.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Error("not made again when less than a tenth of its validity was left")
	}
}

// writePair writes a self-signed certificate for name and its key to dir.
func writePair(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	c, err := newSelfSigned([]string{name}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	// Written beside and renamed over, as a Secret's volume is updated.
	for path, data := range map[string][]byte{
		certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}),
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
	} {
		if err := os.WriteFile(path+".new", data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

func TestTheOperatorsCertificateIsServedAndItsRenewalPickedUp(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "first.example")
	cfg, err := Config(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	if c, err := peer(addr, tls.VersionTLS13); err != nil || c.DNSNames[0] != "first.example" {
		t.Fatalf("served %v, %v; want first.example's", c, err)
	}
	// Half a renewal (a certificate with the old key) keeps the last pair.
	if err := os.WriteFile(certFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(recheck + 100*time.Millisecond) // the files are read at most once a second
	if c, err := peer(addr, tls.VersionTLS13); err != nil || c.DNSNames[0] != "first.example" {
		t.Fatalf("while the certificate file is unreadable: served %v, %v; want the last good one", c, err)
	}
	writePair(t, dir, "second.example")
	poll.Until(t, "the renewed certificate to be served", func() bool {
		c, err := peer(addr, tls.VersionTLS13)
		return err == nil && c.DNSNames[0] == "second.example"
	})
}

func TestConfigRefusesHalfAPairOrFilesThatDoNotMatch(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "a.example")
	if _, err := Config(certFile, "", nil); err == nil || !strings.Contains(err.Error(), "both") {
		t.Errorf("only a certificate file: %v", err)
	}
	other := t.TempDir()
	_, otherKey := writePair(t, other, "b.example")
	if _, err := Config(certFile, otherKey, nil); err == nil {
		t.Error("a certificate with another certificate's key was accepted")
	}
	if _, err := Config(filepath.Join(dir, "missing"), keyFile, nil); err == nil {
		t.Error("a missing certificate file was accepted")
	}
}

// Package servingcert is the TLS configuration of a server of the daemon:
// the operator's certificate and key files, read again when either changes
// (a certificate renewed by cert-manager is served at the next handshake),
// or, without them, a self-signed certificate made in memory at start, as
// the kubelet and controller-runtime do, made again before it expires.
// TLS 1.2 is the oldest version served.
package servingcert

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"

	"github.com/podres-proxy/podres-proxy/internal/credfile"
)

// Validity is how long a self-signed certificate is valid; it is made again
// once less than a tenth of it is left.
const Validity = 365 * 24 * time.Hour

// Config returns the TLS configuration serving certFile and keyFile, or a
// self-signed certificate for hosts (names and IP addresses) when both are
// "". It fails when only one is given or the files do not hold a matching
// certificate and key.
func Config(certFile, keyFile string, hosts []string) (*tls.Config, error) {
	var get func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	switch {
	case certFile == "" && keyFile == "":
		s := &selfSigned{hosts: hosts, now: time.Now}
		if _, err := s.get(nil); err != nil {
			return nil, err
		}
		get = s.get
	case certFile == "" || keyFile == "":
		return nil, errors.New("give both the certificate file and the key file, or neither (a self-signed certificate)")
	default:
		f := &files{certFile: certFile, keyFile: keyFile}
		if _, err := f.get(nil); err != nil {
			return nil, err
		}
		get = f.get
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: get}, nil
}

// files serves the certificate and key files, read again when their content
// changes; a failed reading keeps the certificate last read.
type files struct {
	certFile, keyFile string

	mu      sync.Mutex
	certPEM []byte
	keyPEM  []byte
	cert    *tls.Certificate
	checked time.Time
}

// recheck bounds how often the files are read: at most once a second.
const recheck = time.Second

func (f *files) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if f.cert != nil && now.Sub(f.checked) < recheck {
		return f.cert, nil
	}
	f.checked = now
	certPEM, err := credfile.Read(f.certFile)
	if err == nil {
		var keyPEM []byte
		if keyPEM, err = credfile.Read(f.keyFile); err == nil {
			if f.cert != nil && bytes.Equal(certPEM, f.certPEM) && bytes.Equal(keyPEM, f.keyPEM) {
				return f.cert, nil
			}
			var c tls.Certificate
			if c, err = tls.X509KeyPair(certPEM, keyPEM); err == nil {
				f.cert, f.certPEM, f.keyPEM = &c, certPEM, keyPEM
				return f.cert, nil
			}
		}
	}
	if f.cert == nil {
		return nil, fmt.Errorf("serving certificate %s, key %s: %w", f.certFile, f.keyFile, err)
	}
	return f.cert, nil // a renewal half written: keep serving the last one
}

// selfSigned is a certificate made in memory, again when it nears expiry.
type selfSigned struct {
	hosts []string
	now   func() time.Time

	mu   sync.Mutex
	cert *tls.Certificate
}

func (s *selfSigned) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.cert != nil && now.Before(s.cert.Leaf.NotAfter.Add(-Validity/10)) {
		return s.cert, nil
	}
	c, err := newSelfSigned(s.hosts, now)
	if err != nil {
		if s.cert != nil {
			return s.cert, nil
		}
		return nil, err
	}
	s.cert = c
	return c, nil
}

// newSelfSigned makes an ECDSA P-256 certificate for hosts, valid from now
// (less a minute for clocks behind) for Validity.
func newSelfSigned(hosts []string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "podres-proxy"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(Validity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

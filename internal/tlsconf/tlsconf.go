// Package tlsconf builds the TLS client settings of a broker connection
// from PEM files named in the configuration, for every sink that has them.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/outboxrelay/relay/sink"
)

// Files names the PEM files of a TLS client (see sink.TLS).
type Files = sink.TLS

// Config returns the TLS settings of f, or nil when TLS is off. key is the
// configuration key of f (sink.kafka.tls), which errors name. TLS 1.2 is
// the oldest version offered.
func Config(key string, f Files) (*tls.Config, error) {
	if !f.Enabled {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.InsecureSkipVerify} //nolint:gosec // opt-in, documented for tests only
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.ca_file: %w", key, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.ca_file: no PEM certificate in %s", key, f.CAFile)
		}
	}
	if f.CertFile != "" || f.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s.cert_file and key_file: %w", key, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

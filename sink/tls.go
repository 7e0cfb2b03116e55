package sink

// TLS names the PEM files of a sink's TLS client connection to its broker.
// The zero value is TLS off.
type TLS struct {
	// Enabled turns TLS on. Default false.
	Enabled bool
	// CAFile is a PEM file of the certificate authorities that sign the
	// brokers' certificates. Default empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are the PEM client certificate and key for
	// mutual TLS. Default empty: no client certificate.
	CertFile string
	KeyFile  string
	// InsecureSkipVerify accepts any broker certificate. For tests only.
	InsecureSkipVerify bool
}

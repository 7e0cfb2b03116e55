package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/outboxrelay/relay/internal/buildinfo"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/rowtext"
)

// liveStatus is what a running relay's GET /status answers: the state only
// its process knows. relay status reads it.
type liveStatus struct {
	// Address is the HTTP address the relay advertises (see advertised);
	// empty while it starts.
	Address string `json:"address,omitempty"`
	// Hostname is the relay host's name (a Kubernetes pod's name).
	Hostname string `json:"hostname"`
	// PID is the relay's process id.
	PID int `json:"pid"`
	// Version is the relay's version (see buildinfo).
	Version string `json:"version"`
	// Starting, when set, says why the relay has not started yet: it waits
	// for Postgres or the broker.
	Starting string `json:"starting,omitempty"`
	// Peers are the HTTP addresses of the relays on the outbox (itself
	// included) as the relay last read them from the database, at PeersAt;
	// relay status asks them when it cannot reach the database.
	Peers   []string   `json:"peers,omitempty"`
	PeersAt *time.Time `json:"peers_read_at,omitempty"`
	// Capturing is false while capture fails (Postgres unreachable).
	Capturing bool `json:"capturing"`
	// Ready is false while the relay cannot publish (pipeline.Stats.SinkReady).
	Ready bool `json:"ready"`
	// DatabaseError is why the database refuses the relay, if it does.
	DatabaseError string `json:"database_error,omitempty"`
	// Leading is, in wal mode, whether this relay streams (else it stands by).
	Leading *bool `json:"leading,omitempty"`
	// PartitionsHeld is, in poll mode, how many partitions this relay leases.
	PartitionsHeld *int `json:"partitions_held,omitempty"`
	// Broken lists the destinations whose events are held because they fail;
	// a working destination is not listed.
	Broken []liveDestination `json:"broken_destinations"`
	// The counters since the relay started.
	Captured     int64 `json:"events_captured"`
	Published    int64 `json:"events_published"`
	DeadLettered int64 `json:"events_dead_lettered"`
	Retries      int64 `json:"publish_retries"`
	InFlight     int64 `json:"events_in_flight"`
}

// liveDestination is one broken destination of liveStatus.
type liveDestination struct {
	Name  string    `json:"name"`
	Since time.Time `json:"since"`
	Error string    `json:"error"`
}

// newLiveStatus returns the liveStatus of a relay that does not capture
// yet: its host, process and version.
func newLiveStatus() liveStatus {
	host, _ := os.Hostname()
	return liveStatus{Hostname: host, PID: os.Getpid(), Version: buildinfo.Read().Version, Broken: []liveDestination{}}
}

// live returns the relay's liveStatus.
func (r *Relay) live() liveStatus {
	st := r.Stats()
	s := newLiveStatus()
	s.Address, s.Capturing, s.Ready = r.addr, r.capturing(), st.SinkReady()
	s.Captured, s.Published, s.DeadLettered = st.Captured.Load(), st.Published.Load(), st.DeadLettered.Load()
	s.Retries, s.InFlight = st.Retries.Load(), st.InFlight.Load()
	if p := r.peers.load(); p != nil {
		s.Peers, s.PeersAt = p.Addresses, &p.At
	}
	if err := r.dbFailures.failing(); err != nil {
		s.DatabaseError = redact.String(err.Error())
	}
	if l, ok := r.source.(leader); ok {
		leading := l.Leading()
		s.Leading = &leading
	}
	if p, ok := r.source.(partitioned); ok {
		held, _ := p.Partitions()
		s.PartitionsHeld = &held
	}
	for _, d := range r.pipeline.Destinations() {
		s.Broken = append(s.Broken, liveDestination{Name: rowtext.Value(d.Name), Since: d.Since.UTC(),
			Error: rowtext.Error(redact.String(d.Err))})
	}
	return s
}

// serveLive answers GET /status with the relay's liveStatus as JSON.
func (r *Relay) serveLive(w http.ResponseWriter, _ *http.Request) { writeLive(w, r.live()) }

// writeLive writes s as the JSON answer of GET /status.
func writeLive(w http.ResponseWriter, s liveStatus) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(s)
}

// liveTimeout bounds relay status's request to a running relay.
const liveTimeout = 5 * time.Second

// endpointOf returns the base URL relay status reaches a relay listening
// on listen at: a wildcard host (empty, 0.0.0.0 or ::) is reached on
// localhost. It returns "" when listen is empty.
func endpointOf(listen string) string {
	if listen == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// fetchLive reads GET /status from the relay at base.
func fetchLive(ctx context.Context, base string) (liveStatus, error) {
	var s liveStatus
	ctx, cancel := context.WithTimeout(ctx, liveTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/status", nil)
	if err != nil {
		return s, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("GET /status: %s", resp.Status)
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<20)).Decode(&s); err != nil {
		return s, fmt.Errorf("GET /status: %w", err)
	}
	return s, nil
}

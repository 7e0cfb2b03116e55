package app

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/internal/schema"
)

// A relay that serves HTTP advertises where: every connection relay run
// opens carries the application_name "outbox-relay HOST:PORT" (see
// relayName), which pg_stat_activity shows to every role. relay status
// reads it from the session holding the relay's capture configuration
// lock (schema.Relays), so it finds every relay on the outbox from any
// host, and each relay keeps the addresses of the others (peers) for
// relay status to ask when the database cannot be reached.

// relayName returns the application_name of relay run's connections:
// applicationName, followed by addr when there is one.
func relayName(addr string) string {
	if addr == "" {
		return applicationName
	}
	return applicationName + " " + addr
}

// addressOf returns the HTTP address a relay's application_name name
// advertises (see relayName), or "" when it advertises none.
func addressOf(name string) string {
	addr, ok := strings.CutPrefix(name, applicationName+" ")
	if !ok {
		return ""
	}
	if _, _, err := net.SplitHostPort(addr); err != nil || rowtext.Clean(addr, len(addr)) != addr {
		return ""
	}
	return addr
}

// advertiseTimeout bounds the lookup of the local address advertised uses.
const advertiseTimeout = 5 * time.Second

// advertised returns the host:port other hosts reach this relay's HTTP
// server at: http.advertise when set; else http.listen's host, or for a
// wildcard host the local IP address this host reaches Postgres from
// (127.0.0.1 over a Unix socket, the host name when it cannot be found),
// with the port bound (the one http.listen names unless it is 0). It
// returns "" without http.listen.
func advertised(ctx context.Context, cfg *config.Config, bound net.Addr) string {
	if cfg.HTTP.Listen == "" {
		return ""
	}
	if cfg.HTTP.Advertise != "" {
		return cfg.HTTP.Advertise
	}
	host, port, err := net.SplitHostPort(cfg.HTTP.Listen)
	if err != nil {
		return ""
	}
	if tcp, ok := bound.(*net.TCPAddr); ok {
		port = strconv.Itoa(tcp.Port)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = localHost(ctx, cfg.Postgres.URL)
	}
	return net.JoinHostPort(host, port)
}

// localHost returns the local IP address this host reaches the database
// of url from, found without sending a packet (a UDP socket's address once
// connected), 127.0.0.1 for a Unix socket, or the host name.
func localHost(ctx context.Context, url string) string {
	fallback, _ := os.Hostname()
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return fallback
	}
	if strings.HasPrefix(pc.Host, "/") {
		return "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, advertiseTimeout)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "udp", net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))))
	if err != nil {
		return fallback
	}
	defer conn.Close()
	udp, ok := conn.LocalAddr().(*net.UDPAddr)
	if !ok || udp.IP.IsUnspecified() {
		return fallback
	}
	return udp.IP.String()
}

// peersInterval is how often a relay reads which relays run on its outbox.
const peersInterval = 15 * time.Second

// peers holds the HTTP addresses of the relays on the outbox as a relay
// last read them. It is safe for concurrent use.
type peers struct {
	last atomic.Pointer[peerList]
}

// peerList is one reading of peers.
type peerList struct {
	Addresses []string
	At        time.Time
}

// load returns the last reading, or nil before the first.
func (p *peers) load() *peerList { return p.last.Load() }

// watch reads the relays on l's outbox every peersInterval until ctx ends.
// A failed reading keeps the last one, which is what relay status asks when
// the database is unreachable; capture errors are reported elsewhere.
func (p *peers) watch(ctx context.Context, pool *pgxpool.Pool, l schema.Layout) error {
	t := time.NewTicker(peersInterval)
	defer t.Stop()
	for {
		if sessions, err := schema.Relays(ctx, pool, l); err == nil {
			list := &peerList{Addresses: []string{}, At: time.Now().UTC()}
			for _, s := range sessions {
				if addr := addressOf(s.Application); addr != "" {
					list.Addresses = append(list.Addresses, addr)
				}
			}
			p.last.Store(list)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

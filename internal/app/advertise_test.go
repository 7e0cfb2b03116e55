package app

import (
	"context"
	"net"
	"testing"

	"github.com/outboxrelay/relay/config"
)

// TestAdvertised checks the address a relay publishes: http.advertise as
// given, a listen host as given with the bound port, a wildcard host as
// the local address toward Postgres (127.0.0.1 over a Unix socket or
// toward a loopback server), none without http.listen; and that
// addressOf reads back only what relayName wrote, printable.
func TestAdvertised(t *testing.T) {
	bound := &net.TCPAddr{IP: net.IPv4zero, Port: 4321}
	for _, c := range []struct {
		listen, advertise, url string
		bound                  net.Addr
		want                   string
	}{
		{"", "", "postgres://h/db", nil, ""},
		{"127.0.0.1:9090", "", "postgres://h/db", nil, "127.0.0.1:9090"},
		{"127.0.0.1:0", "", "postgres://h/db", bound, "127.0.0.1:4321"},
		{":9090", "relay-0.relay:9090", "postgres://h/db", nil, "relay-0.relay:9090"},
		{"0.0.0.0:9090", "", "postgres://127.0.0.1:5432/db", nil, "127.0.0.1:9090"},
		{"[::]:9090", "", "postgres:///db?host=/var/run/postgresql", nil, "127.0.0.1:9090"},
	} {
		cfg := &config.Config{HTTP: config.HTTP{Listen: c.listen, Advertise: c.advertise}, Postgres: config.Postgres{URL: c.url}}
		if got := advertised(context.Background(), cfg, c.bound); got != c.want {
			t.Errorf("advertised(listen %q, advertise %q, %s) = %q, want %q", c.listen, c.advertise, c.url, got, c.want)
		}
	}
	for name, want := range map[string]string{
		relayName("10.0.0.5:9090"):          "10.0.0.5:9090",
		relayName(""):                       "",
		"outbox-relay":                      "",
		"outbox-relay nonsense":             "",
		"outbox-relay 10.0.0.5:9090\x1b[2J": "",
		"psql 10.0.0.5:9090":                "",
	} {
		if got := addressOf(name); got != want {
			t.Errorf("addressOf(%q) = %q, want %q", name, got, want)
		}
	}
}

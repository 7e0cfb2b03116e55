package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// SwitchProxy forwards TCP connections from a fixed loopback port to a
// target and can go down (connections cut, new ones refused) and up again
// on the same port: a broker outage without losing the broker's data.
// Its methods are safe for concurrent use.
type SwitchProxy struct {
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener // nil while down
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewSwitchProxy starts a proxy to target on a free port; t's cleanup
// stops it.
func NewSwitchProxy(t *testing.T, target string) *SwitchProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &SwitchProxy{target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(func() {
		p.Down()
		p.wg.Wait()
	})
	return p
}

// Addr returns the proxy's host:port, the same while it is down.
func (p *SwitchProxy) Addr() string { return p.addr }

func (p *SwitchProxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = struct{}{}, struct{}{}
			p.mu.Unlock()
			p.wg.Go(func() { io.Copy(up, c); up.Close(); c.Close() })
			p.wg.Go(func() { io.Copy(c, up); up.Close(); c.Close() })
		}
	})
}

// Down stops listening and cuts every connection.
func (p *SwitchProxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// Up listens on the same port again.
func (p *SwitchProxy) Up(t *testing.T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return
	}
	var ln net.Listener
	var err error
	for range 100 {
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("proxy up on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

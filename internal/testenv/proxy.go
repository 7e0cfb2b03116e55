package testenv

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a target address,
// and can cut or stall them, for fault-injection tests. Its methods are safe
// for concurrent use.
type Proxy struct {
	ln     net.Listener // guarded by mu after StartProxy
	addr   *net.TCPAddr
	target string

	mu      sync.Mutex
	down    bool // the listener is closed by Down
	conns   map[net.Conn]struct{}
	stalled bool
	resume  chan struct{} // closed when a stall ends
	wg      sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards to target.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, addr: ln.Addr().(*net.TCPAddr), target: target, conns: map[net.Conn]struct{}{}, resume: make(chan struct{})}
	close(p.resume)
	p.wg.Go(func() { p.accept(ln) })
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.addr.String() }

// Port returns the proxy's port.
func (p *Proxy) Port() int { return p.addr.Port }

// Cut closes every open connection; new ones are accepted as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Stall stops moving bytes in both directions, keeping connections open,
// until Resume. Connections made meanwhile stall too.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled = true
		p.resume = make(chan struct{})
	}
}

// Resume ends a stall.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
}

// Down stops listening and closes every connection, so that connecting
// is refused, until Up.
func (p *Proxy) Down() {
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		return
	}
	p.down = true
	ln := p.ln
	p.mu.Unlock()
	ln.Close()
	p.Cut()
}

// Up listens again on the port Down closed, retrying for a few seconds
// while the port is not yet free.
func (p *Proxy) Up() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.down {
		return nil
	}
	var ln net.Listener
	var err error
	for range 250 {
		if ln, err = net.Listen("tcp", p.addr.String()); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	p.ln, p.down = ln, false
	p.wg.Go(func() { p.accept(ln) })
	return nil
}

// NewProxy starts a proxy to target as StartProxy does; t's cleanup closes
// it.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := StartProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Close stops listening, closes every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() {
	p.Down()
	p.Resume()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept(ln net.Listener) {
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
		p.track(c, up)
		p.wg.Go(func() { p.pipe(up, c) })
		p.wg.Go(func() { p.pipe(c, up) })
	}
}

// track registers a connection pair.
func (p *Proxy) track(a, b net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[a], p.conns[b] = struct{}{}, struct{}{}
}

// pipe copies src to dst, waiting out stalls, and closes both at the end.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
		src.Close()
		dst.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.waitStall()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) waitStall() {
	p.mu.Lock()
	ch := p.resume
	p.mu.Unlock()
	<-ch
}

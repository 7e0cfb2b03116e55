package wal

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// markConn is the replication connection's TCP connection on Linux. While
// the stream is paced (see pacedReader) its reader raises the socket's
// receive low-water mark (SO_RCVLOWAT) to replSmallRead before it sleeps:
// Linux then wakes no poller for the walsender's small messages, several
// per transaction, until that many bytes wait, so a busy stream of small
// transactions wakes the relay once per pace instead of once per message.
// A read takes whatever waits, under the mark or not; one that finds
// nothing lowers the mark to 1 before it waits for data, so a keepalive or
// a lone transaction after a pause is read as it arrives. Read is used by
// one goroutine at a time; raise may be called from another.
type markConn struct {
	*net.TCPConn
	raw syscall.RawConn

	mu      sync.Mutex
	high    bool // the mark is replSmallRead
	reading bool // a Read runs and may wait for data: the mark stays as it is
}

// withMark returns c as a markConn when it is a TCP connection, else c.
func withMark(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &markConn{TCPConn: tc, raw: raw}
}

// markRaiser returns the raise function of the markConn that w, a
// connection as pgconn hands it to BuildFrontend (TLS or not), runs on, or
// nil when it has none.
func markRaiser(w io.Writer) func() {
	if t, ok := w.(*tls.Conn); ok {
		w = t.NetConn()
	}
	if m, ok := w.(*markConn); ok {
		return m.raise
	}
	return nil
}

// raise sets the mark to replSmallRead, unless a Read runs (it may be
// waiting for data, which must wake it at any size).
func (c *markConn) raise() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.high || c.reading {
		return
	}
	var err error
	if cerr := c.raw.Control(func(fd uintptr) { err = setMark(fd, replSmallRead) }); cerr != nil {
		return
	}
	c.high = err == nil
}

// Read reads what the socket holds. With the mark raised, a read that
// finds nothing lowers it before it waits.
func (c *markConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	c.reading = true
	high := c.high
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.reading = false
		c.mu.Unlock()
	}()
	if !high || len(b) == 0 {
		return c.TCPConn.Read(b)
	}
	var n int
	var err error
	rerr := c.raw.Read(func(fd uintptr) bool {
		n, err = readFD(fd, b)
		if err == syscall.EAGAIN && c.lower(fd, &err) {
			n, err = readFD(fd, b)
		}
		return err != syscall.EAGAIN
	})
	switch {
	case rerr != nil:
		return 0, rerr
	case err != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", err)}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// lower sets the mark back to 1 when it is raised and reports whether it
// did; a failure to lower it is stored in err, so that Read returns it
// rather than wait with the mark raised.
func (c *markConn) lower(fd uintptr, err *error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.high {
		return false
	}
	if e := setMark(fd, 1); e != nil {
		*err = e
		return false
	}
	c.high = false
	return true
}

func setMark(fd uintptr, n int) error {
	return syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
}

// readFD reads from fd once, again when a signal interrupted it.
func readFD(fd uintptr, b []byte) (int, error) {
	for {
		n, err := syscall.Read(int(fd), b)
		if err != syscall.EINTR {
			return n, err
		}
	}
}

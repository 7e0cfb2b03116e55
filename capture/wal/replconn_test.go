package wal

import (
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// readSizes is a stream of CopyData messages that records how much each
// Read asked for.
type readSizes struct {
	data []byte
	asks []int
}

func (r *readSizes) Read(p []byte) (int, error) {
	r.asks = append(r.asks, len(p))
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// TestReplConnReadsLargeChunks: the replication connection takes the
// stream from the socket in reads of replReadBuffer, not pgx's 8 KiB, and
// still yields every message whole and in order.
func TestReplConnReadsLargeChunks(t *testing.T) {
	var data []byte
	for i := range 1000 {
		m := &pgproto3.CopyData{Data: append([]byte{byte(i)}, make([]byte, 399)...)}
		data, _ = m.Encode(data)
	}
	r := &readSizes{data: data}
	cfg, _ := pacedConfig(replConfig(Options{ReplConfig: &pgconn.Config{}}), DefaultLinger, nil)
	f := cfg.BuildFrontend(r, io.Discard)
	for i := range 1000 {
		m, err := f.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := m.(*pgproto3.CopyData); !ok || len(d.Data) != 400 || d.Data[0] != byte(i) {
			t.Fatalf("message %d: %T %v", i, m, m)
		}
	}
	if r.asks[0] < replReadBuffer || len(r.asks) > len(data)/replReadBuffer+2 {
		t.Fatalf("reads of %v bytes for %d bytes of stream", r.asks, len(data))
	}
}

// TestPacedReaderPacesOnlyBusyStreams: a small read right after another
// marks the stream busy (the next read waits for the pace), a large read
// does not, and the connection's reader is told before each read that it
// caught up.
func TestPacedReaderPacesOnlyBusyStreams(t *testing.T) {
	src := &readSizes{data: make([]byte, replReadBuffer+200)}
	caught := 0
	p := &pacedReader{r: src, pace: time.Hour, caughtUp: func() { caught++ }}
	small := make([]byte, 100)
	if _, err := p.Read(small); err != nil || p.busy {
		t.Fatalf("first small read: busy %v, err %v", p.busy, err)
	}
	if _, err := p.Read(small); err != nil || !p.busy {
		t.Fatalf("second small read within the pace: busy %v, err %v", p.busy, err)
	}
	p.busy = false // skip the hour's wait
	if _, err := p.Read(make([]byte, replReadBuffer)); err != nil || p.busy {
		t.Fatalf("large read: busy %v, err %v", p.busy, err)
	}
	if caught != 3 {
		t.Fatalf("caughtUp called %d times for 3 reads", caught)
	}
}

// readerFunc is an io.Reader calling itself.
type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(b []byte) (int, error) { return f(b) }

// TestPacedReaderIgnoresInterruptedReads: a read that a deadline or a poke
// ends with nothing read neither marks the stream busy nor counts as the
// last read, so the next read, of the next transaction, is not paced.
func TestPacedReaderIgnoresInterruptedReads(t *testing.T) {
	p := &pacedReader{pace: time.Hour, last: time.Now(), r: readerFunc(func([]byte) (int, error) {
		return 0, os.ErrDeadlineExceeded
	})}
	if _, err := p.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) || p.busy {
		t.Fatalf("interrupted read: busy %v, err %v", p.busy, err)
	}
}

// TestPacerSleeps: a pacer's sleep lasts at least its duration, also
// after close (Go's timers then) and when nil.
// TestPacerSleepsTogether: two sleeps on one pacer at once (an ended
// stream's last paced read beside the next connection's handshake) both
// end; the second used to re-arm the timer the first waited on, which
// woke only one of them.
func TestPacerSleepsTogether(t *testing.T) {
	p := newPacer()
	defer p.close()
	done := make(chan time.Duration, 2)
	sleep := func(d time.Duration) {
		start := time.Now()
		p.sleep(d)
		done <- time.Since(start)
	}
	go sleep(300 * time.Millisecond)
	time.Sleep(50 * time.Millisecond) // the second starts while the first sleeps
	go sleep(time.Millisecond)
	for range 2 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("a sleep on a pacer another sleep used has not ended after 30s")
		}
	}
}

func TestPacerSleeps(t *testing.T) {
	p := newPacer()
	var none *pacer
	for _, c := range []struct {
		name  string
		p     *pacer
		close bool
	}{{"open", p, false}, {"closed", p, true}, {"nil", none, false}} {
		if c.close {
			c.p.close()
		}
		for _, d := range []time.Duration{time.Millisecond, 3 * time.Millisecond} {
			start := time.Now()
			c.p.sleep(d)
			if took := time.Since(start); took < d {
				t.Errorf("%s: sleep(%s) returned after %s", c.name, d, took)
			}
		}
	}
}

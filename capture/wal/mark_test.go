//go:build linux

package wal_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/verify"
)

// TestRaisedMarkReadsEveryMessage streams a busy run of single-row
// transactions, so the replication socket's receive mark is raised while
// reads are paced, then a lone event and a backlog. With the mark raised a
// read waiting for data would wait until the next status update (a third
// of wal_sender_timeout, 200 s here): the mark is back at 1 once the
// stream is idle, the lone event arrives at once and the backlog whole.
func TestRaisedMarkReadsEveryMessage(t *testing.T) {
	pool := setup(t, layout)
	o := options(t, pool, layout, 500)
	quietStatus(&o)
	var repl atomic.Pointer[net.TCPConn]
	dial := o.ReplConfig.DialFunc
	o.ReplConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			repl.Store(tc)
		}
		return c, err
	}
	src := newStreaming(t, o)
	rec := &recorder{log: verify.NewLog()}
	run(t, src, rec)
	mark := func() int {
		raw, err := repl.Load().SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var v int
		var gerr error
		if err := raw.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT) }); err != nil || gerr != nil {
			t.Fatalf("SO_RCVLOWAT: %v %v", err, gerr)
		}
		return v
	}

	// Writers commit single-row transactions until the mark was seen
	// raised and at least 500 committed.
	var raised atomic.Bool
	var written atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil && !(raised.Load() && written.Load() >= 500); i++ {
				if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
					VALUES (gen_random_uuid(), 'order', $1, 'step', '{}')`, fmt.Sprintf("w%d", w)); err != nil {
					return
				}
				written.Add(1)
			}
		})
	}
	for ctx.Err() == nil && !(raised.Load() && written.Load() >= 500) {
		raised.Store(raised.Load() || mark() > 1)
		time.Sleep(100 * time.Microsecond)
	}
	wg.Wait()
	if !raised.Load() {
		t.Fatalf("the receive mark was never raised in %d transactions: the stream was never paced", written.Load())
	}
	n := written.Load()
	waitFor(t, 60*time.Second, fmt.Sprintf("the %d events of the busy stream", n), func() bool { return rec.n.Load() >= n })
	waitFor(t, 10*time.Second, "the mark back at 1 once the stream is idle", func() bool { return mark() == 1 })

	insert(t, pool, "lone", 0)
	waitFor(t, 30*time.Second, "the lone event", func() bool { return rec.n.Load() >= n+1 })

	mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'b' || (i % 100), 'step', '{}' FROM generate_series(1, 20000) AS i`)
	waitFor(t, 2*time.Minute, "the backlog", func() bool { return rec.n.Load() >= n+1+20000 })
}

package claim

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
)

// buffered returns how many notifications the lease connection holds
// unread.
func (s *Source) buffered() int {
	if s.lease.conn == nil {
		return 0
	}
	return reflect.ValueOf(s.lease.conn).Elem().FieldByName("notifications").Len()
}

// TestNotificationsStayBounded: with the notify trigger, a steady stream of
// small transactions keeps every claim under fillRows, so wait sleeps
// fillWait and never drops the notifications that the claims, now on the
// lease connection, read into its buffer.
func TestNotificationsStayBounded(t *testing.T) {
	ctx := context.Background()
	pool, l := outboxDB(t, nil)
	for _, q := range l.CreateNotifyTrigger() {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(ctx, Options{Pool: pool, Layout: l, BatchSize: 500, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
				VALUES (gen_random_uuid(), 'order', 'a', 'e', '{}')`)
			time.Sleep(time.Millisecond)
		}
	}()
	most, claims := 0, 0
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		b, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		claims++
		if err := b.Complete(ctx, capture.Outcome{Published: b.Events()}); err != nil {
			t.Fatal(err)
		}
		most = max(most, s.buffered())
	}
	stop.Store(true)
	<-done
	t.Logf("%d claims; up to %d notifications buffered on the lease connection, %d at the end", claims, most, s.buffered())
	if most > 1000 {
		t.Errorf("%d notifications buffered unread", most)
	}
}

package kafka

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/outboxrelay/relay/event"
)

// BenchmarkPublishTransactional publishes batches of 100 events from 8
// concurrent callers to kfake, as the pipeline does, with and without
// sink.kafka.transactional; ns/op is per event.
//
//	go test -run XXX -bench PublishTransactional -benchtime 20000x ./sink/kafka/
func BenchmarkPublishTransactional(b *testing.B) {
	for _, txn := range []bool{false, true} {
		b.Run(fmt.Sprintf("transactional=%v", txn), func(b *testing.B) {
			c := newCluster(b)
			cfg := Config{Brokers: c.ListenAddrs(), Topic: "outbox.{aggregate_type}", Transactional: txn, TransactionalID: "bench"}
			s, err := New(context.Background(), cfg, Options{Logger: quiet()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if err := s.Recover(context.Background(), nil); err != nil {
				b.Fatal(err)
			}
			const batch, callers = 100, 8
			evs := make([]*event.Event, b.N)
			for i := range evs {
				evs[i] = testEvent(i, "order", fmt.Sprint(i%1000))
			}
			b.ResetTimer()
			var wg sync.WaitGroup
			next := make(chan []*event.Event)
			for range callers {
				wg.Go(func() {
					for bt := range next {
						if err := s.Publish(context.Background(), bt); err != nil {
							b.Error(err)
						}
					}
				})
			}
			for i := 0; i < len(evs); i += batch {
				next <- evs[i:min(i+batch, len(evs))]
			}
			close(next)
			wg.Wait()
		})
	}
}

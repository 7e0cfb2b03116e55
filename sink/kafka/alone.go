package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// loner publishes records one at a time, each the only record of its
// batch, with a client of its own, so that a broker's rejection of the
// batch is the record's own. The client is made on first use. A loner is
// safe for concurrent use.
type loner struct {
	mu   sync.Mutex
	cl   *kgo.Client
	done bool     // closed
	busy chan any // holds a token while a record is in the client
}

func newLoner() *loner { return &loner{busy: make(chan any, 1)} }

// client returns the loner's client, making it with opts on first use.
func (l *loner) client(opts func() ([]kgo.Opt, error)) (*kgo.Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.done:
		return nil, errClosed
	case l.cl != nil:
		return l.cl, nil
	}
	kopts, err := opts()
	if err != nil {
		return nil, err
	}
	l.cl, err = kgo.NewClient(kopts...)
	return l.cl, err
}

// close closes the client, if one was made; later calls of client fail.
func (l *loner) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
	if l.cl != nil {
		l.cl.Close()
	}
}

// rejectedBatch reports whether err is a broker's rejection of a record
// batch for its content: an invalid record, or a batch too large. franz-go
// fails every record buffered in the partition with that error, those of
// the rejected batch and those behind it, so it does not say which record
// is at fault. (A record too large for a batch on its own fails in the
// client, with a message without compressed_bytes, and is not one.)
func rejectedBatch(err error) bool {
	return errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.MessageTooLarge) && batchBytes.MatchString(err.Error())
}

// retryAlone publishes again, alone (see publishAlone), each record among
// recs whose failure in errs is the first of its key (keys[i]) and a
// rejected batch (see rejectedBatch), and replaces that failure with the
// outcome. When the record is stored now, the later failed records of its
// key become sink.ErrHeldBack: the rejection failed them too, and they go
// in a later call. Keys whose first failure is another one, or a record
// that did not settle (settled[i] false), are left as they are.
func (s *Sink) retryAlone(ctx context.Context, recs []*kgo.Record, keys []string, errs []error, settled []bool) {
	failed := make(map[string]bool) // keys whose first failure was seen
	stored := make(map[string]bool) // keys whose first failure is stored now
	for i, err := range errs {
		k := keys[i]
		switch {
		case err == nil && settled[i]:
		case stored[k]:
			if err != nil {
				errs[i] = sink.ErrHeldBack
			}
		case !failed[k]:
			failed[k] = true
			if settled[i] && rejectedBatch(err) {
				errs[i] = s.publishAlone(ctx, recs[i], err)
				stored[k] = errs[i] == nil
			}
		}
	}
}

// publishAlone publishes a copy of r, whose batch the broker rejected with
// rejected, as the only record in the loner's client, and returns its
// outcome: nil when it is stored, the broker's error marked as the
// record's own when the broker rejects it again. When that cannot finish
// before ctx ends, it returns rejected as a transient failure that the
// record shares with the others of its batch (fault.AsSuspect).
func (s *Sink) publishAlone(ctx context.Context, r *kgo.Record, rejected error) error {
	notAlone := fault.AsSuspect(fmt.Errorf("%w; the broker rejected a batch of several records with this one, which could not be published alone in time", rejected))
	cl, err := s.alone.client(s.aloneOptions)
	if err != nil {
		return notAlone
	}
	select {
	case s.alone.busy <- nil:
	case <-ctx.Done():
		return notAlone
	}
	res := make(chan error, 1)
	cl.Produce(ctx, &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}, func(_ *kgo.Record, err error) {
		<-s.alone.busy
		res <- err
	})
	select {
	case err := <-res:
		if rejectedBatch(err) {
			return fault.AsPermanent(fmt.Errorf("%w (published alone)", err))
		}
		return err
	case <-ctx.Done():
		return notAlone
	}
}

// aloneOptions are the loner's client options: the sink's connection,
// acknowledgement and batch limits, and no lingering.
func (s *Sink) aloneOptions() ([]kgo.Opt, error) {
	kopts, err := s.connOptions()
	if err != nil {
		return nil, err
	}
	return append(kopts,
		kgo.WithHooks(connectHook{s}),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.ProduceRequestTimeout(s.opts.ProduceRequestTimeout),
		kgo.ProducerBatchMaxBytesFn(s.maxMessageBytes),
	), nil
}

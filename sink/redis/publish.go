package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
)

// The fields the relay sets on every entry. sink.RelayHeaders and
// sink.RedisRules keep row headers from taking these names.
const (
	fieldMessageID     = "message_id"
	fieldEventType     = "event_type"
	fieldAggregateType = "aggregate_type"
	fieldAggregateID   = "aggregate_id"
	fieldContentType   = "content_type"
	fieldPayload       = "payload"
)

// Publish appends every event of batch to its stream in one pipeline and
// returns nil when Redis acknowledged every XADD, or a *sink.BatchError
// saying which failed and why (see classify). An event with a field over
// the server's proto-max-bulk-len fails as fault.Permanent without being
// sent. Publish is safe for concurrent use.
func (s *Sink) Publish(ctx context.Context, batch []*event.Event) error {
	if len(batch) == 0 {
		return nil
	}
	errs := make([]error, len(batch))
	streams := make([]string, len(batch))
	cmds := make([]*goredis.StringCmd, len(batch))
	limit := s.bulkLimit(ctx)
	large := false // a field some server may refuse as too long
	pipe := s.client.Pipeline()
	for i, e := range batch {
		streams[i] = s.stream.Render(e)
		if err := destname.RedisStream(streams[i]); err != nil {
			errs[i] = fault.AsPermanent(err)
			continue
		}
		if env := s.opts.Envelope; env != nil {
			if errs[i] = env.Check(e); errs[i] != nil {
				continue
			}
		}
		values := s.fields(e)
		name, n := largest(values)
		if n > limit {
			errs[i] = fault.AsPermanent(fmt.Errorf("field %s is %d bytes, over the server's proto-max-bulk-len of %d", name, n, limit))
			continue
		}
		large = large || n > minMaxBulk
		cmds[i] = pipe.XAdd(ctx, &goredis.XAddArgs{Stream: streams[i], MaxLen: s.cfg.MaxLen, Approx: s.cfg.MaxLen > 0, ID: "*", Values: values})
	}
	if pipe.Len() > 0 {
		ran, err := s.exec(ctx, pipe)
		for i, c := range cmds {
			switch {
			case c == nil:
			case !ran:
				errs[i] = err
			default:
				errs[i] = s.result(ctx, c, err)
			}
		}
		var rerr goredis.Error
		if ran && large && err != nil && !errors.As(err, &rerr) {
			// Redis closes the connection of a client that sends a field
			// over proto-max-bulk-len, often before replying: read the
			// limit again to tell the event's fault from the server's.
			s.maxBulk.Store(0)
		}
	}
	failed := false
	for i, err := range errs {
		if err != nil {
			errs[i] = fmt.Errorf("publish %s to redis stream %s: %w", batch[i].ID, streams[i], err)
			failed = true
		}
	}
	if failed {
		return &sink.BatchError{Errs: errs}
	}
	return nil
}

// result returns the error of an XADD of a pipeline that ran with Exec
// error err: nil when it returned an entry id, else its own error reply,
// else err (a connection that failed before the command ran leaves it
// without either).
func (s *Sink) result(ctx context.Context, c *goredis.StringCmd, err error) error {
	switch {
	case c.Err() != nil:
		return s.classify(ctx, c.Err())
	case c.Val() != "":
		return nil
	case err != nil:
		return s.classify(ctx, err)
	}
	return fault.AsUnavailable(errors.New("redis returned no entry id"))
}

// exec runs pipe. It returns ran and Exec's error (the first failed
// command's, or the connection's) when the pipeline ran, or a classified
// error when the sink is closed or ctx ended first; the commands are then
// not to be read. go-redis ends a blocked read only at a
// deadline, so when ctx can be cancelled the pipeline runs in a goroutine
// that exec leaves behind if ctx ends first; that goroutine ends at the
// connection's read timeout (Options.Timeout) or when Close closes the
// connections, and Close waits for it.
func (s *Sink) exec(ctx context.Context, pipe goredis.Pipeliner) (ran bool, err error) {
	if ctx.Done() == nil {
		if s.closed.Load() {
			return false, fault.AsUnavailable(errClosed)
		}
		_, err := pipe.Exec(ctx)
		return true, err
	}
	if err := ctx.Err(); err != nil {
		return false, fault.AsUnavailable(err)
	}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return false, fault.AsUnavailable(errClosed)
	}
	s.abandoned.Add(1)
	s.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		defer s.abandoned.Done()
		_, err := pipe.Exec(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		return true, err
	case <-ctx.Done():
		return false, fault.AsUnavailable(fmt.Errorf("no reply from redis before the context ended: %w", context.Cause(ctx)))
	}
}

// fields returns the field-value pairs of e's entry (see the package
// documentation for the layout).
func (s *Sink) fields(e *event.Event) []any {
	vals := make([]any, 0, 2*(6+len(e.Headers)))
	vals = append(vals, fieldMessageID, e.ID, fieldEventType, e.EventType,
		fieldAggregateType, e.AggregateType, fieldAggregateID, e.AggregateID)
	if e.ContentType != "" {
		vals = append(vals, fieldContentType, e.ContentType)
	}
	if env := s.opts.Envelope; env != nil {
		env.Binary(e, envelope.Kafka, func(k, v string) { vals = append(vals, k, v) })
	}
	names := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		if s.rows.Forward(k) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		vals = append(vals, k, e.Headers[k])
	}
	payload := e.Payload
	if payload == nil {
		payload = []byte{}
	}
	return append(vals, fieldPayload, payload)
}

// largest returns the name and size of the longest argument among the
// field names and values of vals (as fields returns them).
func largest(vals []any) (name string, n int64) {
	for i := 0; i+1 < len(vals); i += 2 {
		k := vals[i].(string)
		var vn int
		switch v := vals[i+1].(type) {
		case string:
			vn = len(v)
		case []byte:
			vn = len(v)
		}
		if int64(len(k)) > n {
			name, n = "name "+strconv.Quote(truncate(k)), int64(len(k))
		}
		if int64(vn) > n {
			name, n = strconv.Quote(truncate(k)), int64(vn)
		}
	}
	return name, n
}

// truncate cuts a row's header name for an error message.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// bulkLimit returns the server's proto-max-bulk-len, read with CONFIG GET
// once and remembered. A server that does not allow CONFIG GET (an ACL, a
// managed service) is assumed to have the default, 512 MB; when the server
// cannot be asked (unreachable), the default serves this call only.
func (s *Sink) bulkLimit(ctx context.Context) int64 {
	if n := s.maxBulk.Load(); n > 0 {
		return n
	}
	res, err := s.client.ConfigGet(ctx, "proto-max-bulk-len").Result()
	var rerr goredis.Error
	switch {
	case err == nil:
		n, perr := strconv.ParseInt(res["proto-max-bulk-len"], 10, 64)
		if perr != nil || n <= 0 {
			n = defaultMaxBulk
		}
		s.maxBulk.Store(n)
		return n
	case errors.As(err, &rerr):
		s.maxBulk.Store(defaultMaxBulk)
	}
	return defaultMaxBulk
}

// unavailableCodes are the error codes (the first word of an error reply)
// that are the destination's fault, whatever the event: the server is
// loading, busy, read-only (a replica), failing over, refuses the
// credentials or the ACL, holds a key of another type under the stream's
// name (the whole stream is unusable, not the event), is out of memory,
// cannot persist, or the cluster is reconfiguring.
var unavailableCodes = map[string]bool{
	"LOADING": true, "BUSY": true, "READONLY": true, "CLUSTERDOWN": true, "MASTERDOWN": true,
	"NOAUTH": true, "WRONGPASS": true, "NOPERM": true, "WRONGTYPE": true, "OOM": true,
	"MISCONF": true, "TRYAGAIN": true, "MOVED": true, "ASK": true, "NOREPLICAS": true,
	"NOMASTERLINK": true, "NOTBUSY": true,
}

// unavailableMessages are ERR replies that are the destination's fault.
var unavailableMessages = []string{"max number of clients reached", "unknown command",
	"DB index is out of range", "SELECT is not allowed in cluster mode"}

// classify marks an XADD's error with its fault.Class. Any error that is
// not an error reply from Redis (refused or dropped connections, timeouts,
// TLS failures, a closed sink) is the destination's fault, as are the
// replies of unavailableCodes. An entry over the proto-max-bulk-len is the
// event's fault (permanent); any other error reply is transient and
// suspect.
func (s *Sink) classify(ctx context.Context, err error) error {
	var rerr goredis.Error
	if !errors.As(err, &rerr) || ctx.Err() != nil {
		if errors.Is(err, goredis.ErrClosed) || s.closed.Load() {
			return fault.AsUnavailable(fmt.Errorf("%w: %w", errClosed, err))
		}
		return fault.AsUnavailable(err)
	}
	msg := strings.TrimPrefix(rerr.Error(), "ERR ")
	code, _, _ := strings.Cut(rerr.Error(), " ")
	switch {
	case unavailableCodes[code]:
		return fault.AsUnavailable(err)
	case strings.Contains(msg, "invalid bulk length"):
		s.maxBulk.Store(0) // read it again: it was lowered
		return fault.AsPermanent(err)
	}
	for _, m := range unavailableMessages {
		if strings.Contains(msg, m) {
			return fault.AsUnavailable(err)
		}
	}
	return fault.AsSuspect(err)
}

package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// DestinationOf implements sink.Destinations: the stream e is appended to.
func (s *Sink) DestinationOf(e *event.Event) string { return s.stream.Render(e) }

// RowChosen implements sink.RowRouted: true when the stream template has
// a placeholder.
func (s *Sink) RowChosen() bool { return !s.stream.Fixed() }

// Probe checks without appending: for sink.Broker, that Redis answers PING
// (which needs a working connection and accepted credentials); for a
// stream, that its key holds a stream or nothing (TYPE). A user not allowed
// TYPE on the stream gets sink.ErrNoProbe for it. Errors are classified
// like Publish's.
func (s *Sink) Probe(ctx context.Context, dest string) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	if dest == sink.Broker {
		if err := s.client.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis PING: %w", s.classify(ctx, err))
		}
		return nil
	}
	typ, err := s.client.Type(ctx, dest).Result()
	switch {
	case goredis.HasErrorPrefix(err, "NOPERM"):
		return sink.ErrNoProbe
	case err != nil:
		return fmt.Errorf("redis TYPE %s: %w", dest, s.classify(ctx, err))
	case typ != "stream" && typ != "none":
		return fault.AsUnavailable(wrongType(dest, typ))
	}
	return nil
}

// ErrCredentialsRefused marks an error of Ping saying that Redis refused
// the sink's credentials (WRONGPASS, or NOAUTH: a password is required).
var ErrCredentialsRefused = errors.New("redis refused the credentials")

// Ping checks that Redis answers and accepts the credentials, for the
// relay's start: it returns an error wrapping ErrCredentialsRefused when it
// does not accept them, and an error classified like Publish's otherwise.
func (s *Sink) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	err := s.client.Ping(ctx).Err()
	switch {
	case err == nil:
		return nil
	case goredis.HasErrorPrefix(err, "WRONGPASS"), goredis.HasErrorPrefix(err, "NOAUTH"):
		return fmt.Errorf("%s: %w: %w", s.where, ErrCredentialsRefused, err)
	}
	return fmt.Errorf("%s: PING: %w", s.where, s.classify(ctx, err))
}

// wrongType is the error of a stream key holding another type.
func wrongType(stream, typ string) error {
	return fmt.Errorf("redis key %s holds a %s, not a stream (WRONGTYPE): rename or delete it, or change sink.redis.stream", stream, typ)
}

// Check verifies, for relay check, that Redis answers with the configured
// credentials, that a fixed stream's key is a stream or missing, and, where
// the server lets the user run ACL DRYRUN (Redis 7), that the user may XADD
// to the stream (a stream rendered from placeholders set to "check" for a
// template). Its errors say what to fix.
func (s *Sink) Check(ctx context.Context) error {
	if err := s.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%s: PING: %w; check sink.redis.url, the credentials and that the server is running", s.where, err)
	}
	stream := s.cfg.Stream
	if !s.stream.Fixed() {
		stream = strings.NewReplacer("{aggregate_type}", "check", "{event_type}", "check", "{aggregate_id}", "check").Replace(stream)
	} else if typ, err := s.client.Type(ctx, stream).Result(); err == nil && typ != "stream" && typ != "none" {
		return wrongType(stream, typ)
	}
	res, err := s.client.Do(ctx, "ACL", "DRYRUN", s.user, "XADD", stream, "*", fieldPayload, "").Text()
	var rerr goredis.Error
	switch {
	case errors.As(err, &rerr):
		return nil // no ACL DRYRUN for this user or server: nothing more to check without writing
	case err != nil:
		return fmt.Errorf("%s: ACL DRYRUN: %w", s.where, err)
	case res != "OK":
		return fmt.Errorf("%s: user %s may not XADD to %s: %s; grant it with ACL SETUSER %s +xadd ~<streams>", s.where, s.user, stream, res, s.user)
	}
	return nil
}

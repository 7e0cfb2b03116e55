package nats

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/internal/redact"
)

// EnsureStream creates the stream cfg.Stream when it is missing, with one
// subject covering every subject the template renders (outbox.* for
// outbox.{aggregate_type}) and cfg.StreamSettings. When the stream exists,
// EnsureStream checks that its subjects cover the template and logs a
// warning for each setting that differs from cfg.StreamSettings; it never
// changes an existing stream. It is safe to call from several relays at
// once.
func (s *Sink) EnsureStream(ctx context.Context) error {
	info, err := s.streamInfo(ctx)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		info, err = s.createStream(ctx)
	} else if err == nil {
		s.compare(info.Config)
	}
	if err != nil {
		return err
	}
	return s.covers(info)
}

// Check verifies that the connection is up and that the stream exists and
// covers the subject template. Its errors say what to change.
func (s *Sink) Check(ctx context.Context) error {
	if !s.nc.IsConnected() {
		return fmt.Errorf("nats %s: not connected (%s); check sink.nats.url and that the server is running", redact.String(s.cfg.URL), s.nc.Status())
	}
	info, err := s.streamInfo(ctx)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("nats stream %s does not exist; run `relay init` to create it (`relay run` creates it too), or set sink.nats.stream to an existing stream", s.cfg.Stream)
	}
	if err != nil {
		return err
	}
	return s.covers(info)
}

func (s *Sink) streamInfo(ctx context.Context) (*jetstream.StreamInfo, error) {
	str, err := s.js.Stream(ctx, s.cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return nil, fmt.Errorf("nats stream %s: %w; enable JetStream on the server (nats-server -js) or for the account", s.cfg.Stream, err)
	case err != nil:
		return nil, fmt.Errorf("nats stream %s: %w", s.cfg.Stream, err)
	}
	return str.CachedInfo(), nil
}

func (s *Sink) createStream(ctx context.Context) (*jetstream.StreamInfo, error) {
	str, err := s.js.CreateStream(ctx, s.streamConfig())
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return s.streamInfo(ctx) // Another relay created it first.
	}
	if err != nil {
		return nil, fmt.Errorf("create nats stream %s with subjects [%s]: %w", s.cfg.Stream, s.pattern, err)
	}
	c := str.CachedInfo().Config
	s.opts.Logger.Info("created nats stream", "stream", s.cfg.Stream, "subjects", s.pattern,
		"replicas", c.Replicas, "storage", c.Storage.String(), "max_age", c.MaxAge, "max_bytes", c.MaxBytes,
		"max_msgs", c.MaxMsgs, "duplicate_window", c.Duplicates)
	return str.CachedInfo(), nil
}

// streamConfig is the configuration of the stream EnsureStream creates.
func (s *Sink) streamConfig() jetstream.StreamConfig {
	st := s.cfg.StreamSettings
	c := jetstream.StreamConfig{
		Name:       s.cfg.Stream,
		Subjects:   []string{s.pattern},
		Storage:    jetstream.FileStorage,
		Replicas:   max(st.Replicas, 1),
		MaxAge:     st.MaxAge,
		MaxBytes:   -1,
		MaxMsgs:    -1,
		Duplicates: st.DuplicateWindow,
	}
	if st.Memory {
		c.Storage = jetstream.MemoryStorage
	}
	if st.MaxBytes > 0 {
		c.MaxBytes = st.MaxBytes
	}
	if st.MaxMsgs > 0 {
		c.MaxMsgs = st.MaxMsgs
	}
	if c.Duplicates <= 0 {
		c.Duplicates = duplicateWindow
	}
	return c
}

// compare logs a warning for each setting of an existing stream that
// differs from the one the relay would create it with.
func (s *Sink) compare(got jetstream.StreamConfig) {
	want := s.streamConfig()
	for _, d := range []struct {
		key       string
		got, want any
	}{
		{"replicas", got.Replicas, want.Replicas},
		{"storage", got.Storage.String(), want.Storage.String()},
		{"max_age", got.MaxAge, want.MaxAge},
		{"max_bytes", got.MaxBytes, want.MaxBytes},
		{"max_msgs", got.MaxMsgs, want.MaxMsgs},
		{"duplicate_window", got.Duplicates, want.Duplicates},
	} {
		if d.got != d.want {
			s.opts.Logger.Warn("nats stream exists with another setting than sink.nats."+d.key+"; the relay never changes an existing stream (nats stream edit does)",
				"stream", s.cfg.Stream, "setting", d.key, "stream_value", d.got, "configured", d.want)
		}
	}
}

// covers fails unless one of the stream's subjects covers s.pattern.
func (s *Sink) covers(info *jetstream.StreamInfo) error {
	for _, filter := range info.Config.Subjects {
		if subsetOf(s.pattern, filter) {
			return nil
		}
	}
	return fmt.Errorf("nats stream %s has subjects [%s], which do not cover %s (from sink.nats.subject %q); add %s to the stream's subjects (nats stream edit %s --subjects ...), or set sink.nats.subject or sink.nats.stream to match",
		s.cfg.Stream, strings.Join(info.Config.Subjects, " "), s.pattern, s.cfg.Subject, s.pattern, s.cfg.Stream)
}

// subsetOf reports whether every subject matching pattern also matches
// filter. Both are subject filters; pattern has no ">" token.
func subsetOf(pattern, filter string) bool {
	p, f := strings.Split(pattern, "."), strings.Split(filter, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(p) > i
		case i >= len(p):
			return false
		case tok != "*" && tok != p[i]:
			return false
		}
	}
	return len(p) == len(f)
}

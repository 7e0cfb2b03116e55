package pubsub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// failOnce fails, with code, the first Publish request that carries a
// message whose message_id is id; every other request goes through.
type failOnce struct {
	id   string
	code codes.Code
	done atomic.Bool
}

func (f *failOnce) React(req any) (bool, any, error) {
	r, ok := req.(*pb.PublishRequest)
	if !ok || f.done.Load() {
		return false, nil, nil
	}
	for _, m := range r.Messages {
		if m.Attributes[attrMessageID] == f.id && f.done.CompareAndSwap(false, true) {
			return true, nil, status.Error(f.code, "injected")
		}
	}
	return false, nil, nil
}

// events returns n events of aggregate agg, with IDs prefix0, prefix1, ...
func events(agg, prefix string, n int) []*event.Event {
	out := make([]*event.Event, n)
	for i := range out {
		out[i] = &event.Event{ID: prefix + string(rune('0'+i)), AggregateType: "order", AggregateID: agg,
			EventType: "created", Payload: []byte(`{}`)}
	}
	return out
}

// ids returns the message_id attributes of msgs.
func ids(msgs []*pstest.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.Attributes[attrMessageID])
	}
	return out
}

// TestPausedKeyResumes fails one request of an ordering key: the client
// pauses the key, the events behind the failed one are held back and not
// published, and the pipeline's republish from the failed event goes
// through (the key is resumed, not stuck) in order.
func TestPausedKeyResumes(t *testing.T) {
	t.Parallel()
	ps := testenv.StartPubSub(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: &failOnce{id: "e2", code: codes.Internal}})
	ps.CreateTopic(t, project, "paused")
	// One message per request, so that e1 is sent before e2 fails.
	s := newSink(t, ps.Addr(), "paused", Options{BatchCount: 1})
	defer s.Close()
	evs := events("agg-1", "e", 5)
	ctx := context.Background()

	err := s.Publish(ctx, evs)
	if got, want := sinktest.Classes(err, 5), []string{"ok", "ok", "unavailable", "unavailable", "unavailable"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (%v)", got, want, err)
	}
	for i := 3; i < 5; i++ {
		if !errors.Is(sink.Failed(err, i), sink.ErrHeldBack) {
			t.Errorf("event %d: %v, want held back", i, sink.Failed(err, i))
		}
	}
	if got := ids(ps.Messages(project, "paused")); !slices.Equal(got, []string{"e0", "e1"}) {
		t.Fatalf("after the failure the topic holds %v, want [e0 e1]: nothing behind the failed e2", got)
	}
	// The pipeline publishes again from the failed event on.
	if err := s.Publish(ctx, evs[2:]); err != nil {
		t.Fatalf("republish after the failure: %v (the key stayed paused)", err)
	}
	if got, want := ids(ps.Messages(project, "paused")), []string{"e0", "e1", "e2", "e3", "e4"}; !slices.Equal(got, want) {
		t.Fatalf("topic holds %v, want %v", got, want)
	}
}

// TestErrorClasses checks the class of each gRPC code Pub/Sub answers a
// publish with, injected into pstest, and of a missing topic.
func TestErrorClasses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code codes.Code
		want string
	}{
		{codes.Unavailable, "unavailable"},
		{codes.DeadlineExceeded, "unavailable"},
		{codes.ResourceExhausted, "unavailable"},
		{codes.Internal, "unavailable"},
		{codes.Unauthenticated, "unavailable"},
		{codes.PermissionDenied, "unavailable"},
		{codes.NotFound, "unavailable"},
		{codes.InvalidArgument, "suspect-permanent"},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			t.Parallel()
			ps := testenv.StartPubSub(t, pstest.WithErrorInjection("Publish", tc.code, "injected"))
			s := newSink(t, ps.Addr(), "classes", Options{})
			defer s.Close()
			err := s.Publish(context.Background(), events("a", "c", 1))
			if got := sinktest.Classes(err, 1); got[0] != tc.want {
				t.Fatalf("%s: %s, want %s: %v", tc.code, got[0], tc.want, err)
			}
		})
	}
	t.Run("missing topic", func(t *testing.T) {
		t.Parallel()
		ps := testenv.StartPubSub(t)
		s := newSink(t, ps.Addr(), "nosuchtopic", Options{})
		defer s.Close()
		err := s.Publish(context.Background(), events("a", "m", 2))
		if got := sinktest.Classes(err, 2); !slices.Equal(got, []string{"unavailable", "unavailable"}) {
			t.Fatalf("missing topic: %v: %v", got, err)
		}
		if err := s.Probe(context.Background(), "nosuchtopic"); err == nil {
			t.Fatal("Probe of a missing topic passed")
		}
		if err := s.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "relay init") {
			t.Fatalf("Check of a missing topic: %v", err)
		}
		if created, err := s.EnsureTopic(context.Background()); !created || err != nil {
			t.Fatalf("EnsureTopic: %v %v", created, err)
		}
		if err := s.Publish(context.Background(), events("a", "m", 2)); err != nil {
			t.Fatalf("after EnsureTopic: %v", err)
		}
	})
}

// TestRejectedWithOthers: a request of several messages of one key that
// Pub/Sub refuses (InvalidArgument) does not dead-letter its first event:
// that one is retried alone, and only a message refused alone is
// permanent.
func TestRejectedWithOthers(t *testing.T) {
	t.Parallel()
	ps := testenv.StartPubSub(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: &rejectID{id: "r1"}})
	ps.CreateTopic(t, project, "rejected")
	s := newSink(t, ps.Addr(), "rejected", Options{BatchDelay: 200 * time.Millisecond})
	defer s.Close()
	evs := events("agg", "r", 3)
	ctx := context.Background()
	err := s.Publish(ctx, evs)
	if got, want := sinktest.Classes(err, 3), []string{"suspect-transient", "suspect-transient", "suspect-transient"}; !slices.Equal(got, want) {
		t.Fatalf("first call: %v, want %v: %v", got, want, err)
	}
	err = s.Publish(ctx, evs)
	if got, want := sinktest.Classes(err, 3), []string{"ok", "transient", "transient"}; !slices.Equal(got, want) {
		t.Fatalf("second call (r0 alone): %v, want %v: %v", got, want, err)
	}
	err = s.Publish(ctx, evs[1:])
	err = s.Publish(ctx, evs[1:])
	if got, want := sinktest.Classes(err, 2), []string{"suspect-permanent", "suspect-permanent"}; !slices.Equal(got, want) {
		t.Fatalf("r1 alone: %v, want %v: %v", got, want, err)
	}
	if err := s.Publish(ctx, evs[2:]); err != nil {
		t.Fatalf("r2 after r1 was refused: %v", err)
	}
	if got := ids(ps.Messages(project, "rejected")); !slices.Equal(got, []string{"r0", "r2"}) {
		t.Fatalf("topic holds %v, want [r0 r2]", got)
	}
}

// rejectID refuses every Publish request carrying message_id id.
type rejectID struct{ id string }

func (r *rejectID) React(req any) (bool, any, error) {
	if p, ok := req.(*pb.PublishRequest); ok {
		for _, m := range p.Messages {
			if m.Attributes[attrMessageID] == r.id {
				return true, nil, status.Error(codes.InvalidArgument, "injected: bad message")
			}
		}
	}
	return false, nil, nil
}

// TestAttributeLimits: attributes Pub/Sub refuses fail the event as
// permanent before it is sent; the later events of its key are held back,
// a row header named goog* is dropped.
func TestAttributeLimits(t *testing.T) {
	t.Parallel()
	ps := testenv.StartPubSub(t)
	ps.CreateTopic(t, project, "limits")
	s := newSink(t, ps.Addr(), "limits", Options{})
	defer s.Close()
	evs := events("agg", "l", 4)
	evs[0].Headers = map[string]string{"googfoo": "x", "ok": "y"}
	evs[1].Headers = map[string]string{"big": strings.Repeat("v", maxAttrValueBytes+1)}
	evs[3].AggregateID = "other"
	evs[3].Headers = map[string]string{strings.Repeat("k", maxAttrNameBytes+1): "v"}
	err := s.Publish(context.Background(), evs)
	if got, want := sinktest.Classes(err, 4), []string{"ok", "permanent", "permanent", "permanent"}; !slices.Equal(got, want) {
		t.Fatalf("%v, want %v: %v", got, want, err)
	}
	if !errors.Is(sink.Failed(err, 2), sink.ErrHeldBack) {
		t.Errorf("event 2: %v, want held back", sink.Failed(err, 2))
	}
	msgs := ps.Messages(project, "limits")
	if len(msgs) != 1 || msgs[0].Attributes["googfoo"] != "" || msgs[0].Attributes["ok"] != "y" {
		t.Fatalf("published %v", msgs)
	}
}

// openPublishers returns how many topic publishers s holds open.
func openPublishers(s *Sink) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.publishers)
}

// TestPublishersBounded publishes to 40 topics of a template, one after
// the other and from 4 goroutines at once: at most MaxPublishers stay
// open, stopping an idle one never fails a publish in flight, and every
// event arrives.
func TestPublishersBounded(t *testing.T) {
	t.Parallel()
	ps := testenv.StartPubSub(t)
	const topics, max = 40, 3
	for i := range topics {
		ps.CreateTopic(t, project, fmt.Sprintf("bound-t%d", i))
	}
	s := newSink(t, ps.Addr(), "bound-{aggregate_id}", Options{MaxPublishers: max})
	defer s.Close()
	ctx := context.Background()
	for i := range topics {
		if err := s.Publish(ctx, events(fmt.Sprintf("t%d", i), "a", 1)); err != nil {
			t.Fatal(err)
		}
		if n := openPublishers(s); n > max {
			t.Fatalf("%d publishers open after publishing to %d topics, want at most %d", n, i+1, max)
		}
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := g; i < topics; i += 4 {
				if err := s.Publish(ctx, events(fmt.Sprintf("t%d", i), "b", 2)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if n := openPublishers(s); n > max {
		t.Fatalf("%d publishers open after concurrent publishes, want at most %d", n, max)
	}
	if got := len(ps.Messages(project, "bound-")); got != topics*3 {
		t.Fatalf("%d messages, want %d", got, topics*3)
	}
}

// TestPausedKeyAcrossEviction: a key paused by a failed publish whose
// topic's publisher is then stopped (another topic took its place) is
// published again from the failed event, in order, on a new publisher.
func TestPausedKeyAcrossEviction(t *testing.T) {
	t.Parallel()
	ps := testenv.StartPubSub(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: &failOnce{id: "e2", code: codes.Internal}})
	ps.CreateTopic(t, project, "evict-x")
	ps.CreateTopic(t, project, "evict-y")
	s := newSink(t, ps.Addr(), "evict-{aggregate_id}", Options{BatchCount: 1, MaxPublishers: 1})
	defer s.Close()
	evs := events("x", "e", 5)
	ctx := context.Background()
	err := s.Publish(ctx, evs)
	if got, want := sinktest.Classes(err, 5), []string{"ok", "ok", "unavailable", "unavailable", "unavailable"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (%v)", got, want, err)
	}
	if err := s.Publish(ctx, events("y", "y", 1)); err != nil {
		t.Fatal(err)
	}
	if n := openPublishers(s); n != 1 {
		t.Fatalf("%d publishers open, want 1: evict-x's was not stopped", n)
	}
	if err := s.Publish(ctx, evs[2:]); err != nil {
		t.Fatalf("republish on a new publisher: %v", err)
	}
	if got, want := ids(ps.Messages(project, "evict-x")), []string{"e0", "e1", "e2", "e3", "e4"}; !slices.Equal(got, want) {
		t.Fatalf("topic holds %v, want %v", got, want)
	}
}

// TestInvalidUTF8Key publishes events whose aggregate ids are short
// invalid UTF-8, which once panicked deriving the ordering key: each fails
// as permanent (Pub/Sub refuses the aggregate_id attribute), the second of
// an aggregate held back behind the first, and nothing is published.
func TestInvalidUTF8Key(t *testing.T) {
	t.Parallel()
	ps := testenv.StartPubSub(t)
	ps.CreateTopic(t, project, "badkey")
	s := newSink(t, ps.Addr(), "badkey", Options{})
	defer s.Close()
	evs := append(events("\xff", "u", 2), events("\xfe\xff", "v", 1)...)
	err := s.Publish(context.Background(), evs)
	if got, want := sinktest.Classes(err, 3), []string{"permanent", "permanent", "permanent"}; !slices.Equal(got, want) {
		t.Fatalf("%v, want %v: %v", got, want, err)
	}
	if !errors.Is(sink.Failed(err, 1), sink.ErrHeldBack) {
		t.Errorf("event 1: %v, want held back", sink.Failed(err, 1))
	}
	if msgs := ps.Messages(project, "badkey"); len(msgs) != 0 {
		t.Fatalf("published %d messages", len(msgs))
	}
}

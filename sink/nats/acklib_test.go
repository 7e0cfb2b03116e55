package nats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestAckErrorAsJetStream publishes every kind of message a real JetStream
// server answers differently (stored, duplicate, each expectation header
// failing, a full stream that discards new messages, a message over the
// stream's size limit, a subject no stream covers) twice: with the
// library's jetstream.PublishMsg, and with a reply subject of the test's
// whose answer goes to ackError as the acker's does. Both must agree: both
// nil, the same *jetstream.APIError code, or the same library error.
func TestAckErrorAsJetStream(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "OPEN", Subjects: []string{"open.>"}},
		{Name: "FULL", Subjects: []string{"full.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew},
		{Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 64},
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	// Each case runs on a subject of its own for each publisher, so both
	// find the stream in the same state.
	cases := []struct {
		name, subject string
		header        map[string]string
		size          int
	}{
		{name: "stored", subject: "open.a"},
		{name: "duplicate", subject: "open.dup", header: map[string]string{"Nats-Msg-Id": "same"}},
		{name: "expected last sequence", subject: "open.seq", header: map[string]string{"Nats-Expected-Last-Sequence": "99"}},
		{name: "expected last subject sequence", subject: "open.subj", header: map[string]string{"Nats-Expected-Last-Subject-Sequence": "99"}},
		{name: "expected last msg id", subject: "open.msgid", header: map[string]string{"Nats-Expected-Last-Msg-Id": "nope"}},
		{name: "expected stream", subject: "open.stream", header: map[string]string{"Nats-Expected-Stream": "OTHER"}},
		{name: "stream full", subject: "full.a"},
		{name: "over the stream's size limit", subject: "small.a", size: 200},
		{name: "no stream", subject: "nowhere.a"},
	}
	if _, err := js.Publish(ctx, "full.x", []byte("x")); err != nil { // FULL holds its one message
		t.Fatal(err)
	}
	// A channel subscription, as the acker's: a synchronous one turns a
	// no-responders status into an error instead of a message.
	inbox := nc.NewInbox()
	replies := make(chan *nats.Msg, 1)
	if _, err := nc.ChanSubscribe(inbox, replies); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msg := func(publisher string) *nats.Msg {
				subject := c.subject + "." + publisher
				m := nats.NewMsg(subject)
				for k, v := range c.header {
					m.Header.Set(k, v)
				}
				m.Data = []byte(strings.Repeat("x", max(c.size, 1)))
				return m
			}
			for range 2 { // the second publish of each finds the first's message
				_, libErr := js.PublishMsg(ctx, msg("lib"), jetstream.WithRetryAttempts(0))
				m := msg("ack")
				m.Reply = inbox
				if err := nc.PublishMsg(m); err != nil {
					t.Fatal(err)
				}
				var reply *nats.Msg
				select {
				case reply = <-replies:
				case <-ctx.Done():
					t.Fatal("no answer")
				}
				ours := ackError(reply)
				if got, want := class(ours), class(libErr); got != want {
					t.Fatalf("ackError %q (%v), jetstream.PublishMsg %q (%v); answer %q %v", got, ours, want, libErr, reply.Data, reply.Header)
				}
			}
		})
	}
}

// class names what a publish's error means to the sink: nil, the server's
// API error code, or the library's error.
func class(err error) string {
	var api *jetstream.APIError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &api):
		return fmt.Sprintf("api error %d", api.ErrorCode)
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return "no stream response"
	default:
		return "other: " + err.Error()
	}
}

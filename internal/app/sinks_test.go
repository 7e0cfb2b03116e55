package app

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink"
)

// TestSinkConfigsMapEveryKey fills every field of each sink's config
// section and checks that the sink's settings receive a value for every
// field, so a key added to one side and not mapped fails here.
func TestSinkConfigsMapEveryKey(t *testing.T) {
	var s config.Sink
	fill(t, reflect.ValueOf(&s).Elem())
	s.NATS.Storage = "memory"
	for name, got := range map[string]any{
		"nats":     natsConfig(s.NATS),
		"kafka":    kafkaConfig(s.Kafka, "outbox-relay.x"),
		"rabbitmq": rabbitmqConfig(s.RabbitMQ),
		"redis":    redisConfig(s.Redis),
		"sqs":      sqsConfig(s.SQS),
		"webhook":  webhookConfig(s.Webhook),
	} {
		checkSet(t, name, reflect.ValueOf(got))
	}
	ps, po := pubsubConfig(s.PubSub)
	checkSet(t, "pubsub", reflect.ValueOf(ps))
	if po.PublishTimeout != s.PubSub.PublishTimeout.D() || po.BatchDelay != s.PubSub.BatchDelay.D() || po.MaxPublishers != s.PubSub.MaxPublishers {
		t.Errorf("pubsub options %+v do not carry publish_timeout, batch_delay and max_publishers of %+v", po, s.PubSub)
	}
	if got := webhookConfig(s.Webhook).Timeout; got != s.Webhook.Timeout.D() {
		t.Errorf("webhook timeout = %s, want %s", got, s.Webhook.Timeout.D())
	}
	if n, c := reflect.TypeFor[config.Sink]().NumField(), 14; n != c { // the sinks, type, envelope, cloudevents, rate_limit, held_max_age (a pipeline option), format and debezium (TestFormatShapesPublish)
		t.Errorf("config.Sink has %d fields, this test maps %d: add the new sink", n, c)
	}
}

// seenSink records the batches published to it.
type seenSink struct {
	routedSink // nil: only Publish is called
	batches    [][]*event.Event
}

func (s *seenSink) Publish(_ context.Context, batch []*event.Event) error {
	s.batches = append(s.batches, batch)
	return nil
}

// TestFormatShapesPublish checks that sink.format debezium reaches the
// sink: brokerSink hands it each event shaped (key, id header, value) and
// leaves the pipeline's events as they were; native hands them on as they
// are.
func TestFormatShapesPublish(t *testing.T) {
	cfg := &config.Config{Sink: config.Sink{Format: "debezium",
		Debezium: config.Debezium{AdditionalPlacement: []string{"event_type:header:eventType"}}}}
	f, err := config.Format(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &event.Event{ID: "e1", AggregateType: "order", AggregateID: "1", EventType: "created",
		Payload: []byte(`{"a": 1}`), ContentType: event.ContentTypeJSON}
	inner := &seenSink{}
	b := &brokerSink{routedSink: inner, format: f}
	if err := b.Publish(context.Background(), []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	got := inner.batches[0][0]
	if got.Key() != `"1"` || got.Headers["id"] != "e1" || got.Headers["eventType"] != "created" || string(got.Payload) != `"{\"a\": 1}"` {
		t.Errorf("shaped: key %s headers %v value %s", got.Key(), got.Headers, got.Payload)
	}
	if e.Headers != nil || string(e.Payload) != `{"a": 1}` || e.Key() != "1" {
		t.Errorf("the pipeline's event changed: %+v", e)
	}
	b.format = nil
	if err := b.Publish(context.Background(), []*event.Event{e}); err != nil || inner.batches[1][0] != e {
		t.Errorf("native: %v, %+v", err, inner.batches[1][0])
	}
}

// TestCloudEventsMapped checks that sink.envelope and
// sink.cloudevents.source reach the envelope the sinks get.
func TestCloudEventsMapped(t *testing.T) {
	env, err := cloudEvents(config.Sink{Envelope: "cloudevents", CloudEvents: config.CloudEvents{Source: "urn:example:orders"}})
	if err != nil || env == nil {
		t.Fatalf("cloudevents: %v, %v", env, err)
	}
	if got := env.Source(&event.Event{AggregateType: "order"}); got != "urn:example:orders/order" {
		t.Errorf("source %q", got)
	}
	for _, none := range []string{"", "none"} {
		if env, err := cloudEvents(config.Sink{Envelope: none, CloudEvents: config.CloudEvents{Source: "urn:x"}}); env != nil || err != nil {
			t.Errorf("envelope %q: %v, %v; want none", none, env, err)
		}
	}
	if _, err := cloudEvents(config.Sink{Envelope: "cloudevents"}); !IsUsage(err) {
		t.Errorf("no source: %v, want a usage error", err)
	}
}

// fill sets every field of v to a value that is not zero.
func fill(t *testing.T, v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fill(t, v.Field(i))
		}
	case reflect.String:
		v.SetString("x")
	case reflect.Int, reflect.Int64:
		if v.Type() == reflect.TypeFor[config.Duration]() {
			v.SetInt(int64(time.Second))
		} else {
			v.SetInt(1)
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(t, v.Index(0))
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		v.SetMapIndex(reflect.ValueOf("k"), reflect.ValueOf("v"))
	default:
		t.Fatalf("fill: %s not handled", v.Type())
	}
}

// checkSet fails for each field of v, recursively, that holds its zero
// value.
func checkSet(t *testing.T, path string, v reflect.Value) {
	if v.Kind() == reflect.Struct {
		for i := range v.NumField() {
			checkSet(t, path+"."+v.Type().Field(i).Name, v.Field(i))
		}
		return
	}
	if v.IsZero() {
		t.Errorf("%s is not mapped from the config", path)
	}
}

// TestSinkOrderedPassedOn checks that the sink the pipeline gets declares
// the wrapped sink's sink.Ordered: several events of one aggregate per
// publish with Kafka, one with a sink that does not implement it.
func TestSinkOrderedPassedOn(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := parse(t, fmt.Sprintf(`postgres:
  url: postgres://app@localhost/app
capture:
  mode: poll
sink:
  type: kafka
  kafka:
    brokers: [%s]
    topic: outbox.{aggregate_type}
`, c.ListenAddrs()[0]))
	snk, err := openSink(context.Background(), cfg, slog.New(slog.DiscardHandler), 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer snk.Close()
	var o sink.Ordered = snk
	if n := o.MaxPerAggregate(); n < 2 {
		t.Errorf("kafka: MaxPerAggregate %d, want several events of an aggregate per publish", n)
	}
	if n := (&brokerSink{}).MaxPerAggregate(); n != 1 {
		t.Errorf("a sink without sink.Ordered: MaxPerAggregate %d, want 1", n)
	}
}

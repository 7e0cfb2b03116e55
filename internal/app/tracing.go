package app

import (
	"context"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/buildinfo"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/tracing"
	"github.com/outboxrelay/relay/sink"
)

// tracingShutdown bounds the export of the last spans when the relay stops.
const tracingShutdown = 5 * time.Second

// startTracing returns the tracer tracing.otlp_endpoint asks for, or nil
// when it is empty; Close flushes its last spans.
func (r *Relay) startTracing(ctx context.Context) (*tracing.Tracer, error) {
	if r.cfg.Tracing.OTLPEndpoint == "" {
		return nil, nil
	}
	t, err := tracing.Start(ctx, r.cfg.Tracing.OTLPEndpoint, buildinfo.Read().Version, r.log)
	if err != nil {
		return nil, err
	}
	r.closers = append(r.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracingShutdown)
		defer cancel()
		if err := t.Shutdown(ctx); err != nil {
			r.log.Warn("tracing: last spans not exported", "err", err)
		}
	})
	return t, nil
}

// tracedSink returns snk with publish spans when t is not nil.
func tracedSink(t *tracing.Tracer, snk *brokerSink, c config.Sink) sink.Sink {
	if t == nil {
		return snk
	}
	return t.Sink(snk, c.Type, destinationTemplate(c))
}

// tracedSource returns src with archive spans when t is not nil.
func tracedSource(t *tracing.Tracer, src capture.Source, cfg *config.Config) capture.Source {
	if t == nil {
		return src
	}
	return t.Source(src, cfg.Outbox.Table, cfg.Archive.Mode)
}

// destinationTemplate returns the configured destination of the sink, the
// name of its publish spans.
func destinationTemplate(c config.Sink) string {
	switch c.Type {
	case "nats":
		return c.NATS.Subject
	case "kafka":
		return c.Kafka.Topic
	case "rabbitmq":
		return c.RabbitMQ.Exchange + " " + c.RabbitMQ.RoutingKey
	case "sqs":
		if c.SQS.Queue != "" {
			return c.SQS.Queue
		}
		return c.SQS.QueueURL
	case "pubsub":
		return c.PubSub.Topic
	}
	return redact.String(c.Webhook.URL)
}

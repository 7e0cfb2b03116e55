package rabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/sink/envelope"
)

// The headers the sink sets on every message.
const (
	hdrMessageID     = "message_id"
	hdrEventType     = "event_type"
	hdrAggregateType = "aggregate_type"
	hdrAggregateID   = "aggregate_id"
)

// message returns e as a persistent AMQP message: the payload as body,
// message_id and content_type properties, the contract headers and the
// row headers the sink forwards, as long strings. It fails as permanent
// when the body is over the sink's limit, or when a short string (the
// event ID, the content type, a header name) is over 255 bytes or the
// content header would not fit one frame of frameMax bytes.
func (s *Sink) message(e *event.Event, frameMax int) (amqp.Publishing, error) {
	if len(e.Payload) > s.maxBody {
		return amqp.Publishing{}, fault.AsPermanent(fmt.Errorf("the payload is %d bytes, over sink.rabbitmq.max_message_bytes (%d)", len(e.Payload), s.maxBody))
	}
	if len(e.ID) > maxShortStr || len(e.ContentType) > maxShortStr {
		return amqp.Publishing{}, fault.AsPermanent(fmt.Errorf("the event id or content type is over the %d bytes of an AMQP short string", maxShortStr))
	}
	h := make(amqp.Table, len(e.Headers)+4)
	for k, v := range e.Headers {
		if !s.rows.Forward(k) {
			continue
		}
		if len(k) > maxShortStr {
			return amqp.Publishing{}, fault.AsPermanent(fmt.Errorf("row header %s: the name is %d bytes, over the %d of an AMQP header name", rowtext.Label(k), len(k), maxShortStr))
		}
		h[k] = v
	}
	h[hdrMessageID] = e.ID
	h[hdrEventType] = e.EventType
	h[hdrAggregateType] = e.AggregateType
	h[hdrAggregateID] = e.AggregateID
	if env := s.opts.Envelope; env != nil {
		if err := env.Check(e); err != nil {
			return amqp.Publishing{}, err
		}
		env.Binary(e, envelope.AMQP, func(k, v string) { h[k] = v })
	}
	if n := headerFrameBytes(e, h); frameMax > 0 && n > frameMax {
		return amqp.Publishing{}, fault.AsPermanent(fmt.Errorf("the message properties and headers are %d bytes encoded, over the connection's frame_max of %d", n, frameMax))
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  e.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    e.ID,
		Body:         e.Payload,
	}, nil
}

// headerFrameBytes returns at least the size of the content header frame
// of e with headers h: frame overhead, class, weight, body size, property
// flags, the short string properties and the table of long strings.
func headerFrameBytes(e *event.Event, h amqp.Table) int {
	n := 8 + 14 + 1 + len(e.ContentType) + 1 + 1 + len(e.ID) + 4
	for k, v := range h {
		n += 1 + len(k) + 1 + 4 + len(v.(string))
	}
	return n
}

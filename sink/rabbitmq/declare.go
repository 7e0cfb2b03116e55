package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Check connects and, when the exchange template has no placeholder and
// names an exchange, checks that the exchange exists. Its error says what
// to fix: credentials, virtual host, the exchange.
func (s *Sink) Check(ctx context.Context) error {
	c, err := s.connection(ctx)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
			return fmt.Errorf("%w; check the user and password of sink.rabbitmq.url", err)
		}
		return err
	}
	exchange := s.cfg.Exchange
	if !s.exchange.Fixed() || exchange == "" {
		return nil
	}
	if err := c.passive(ctx, exchange); err != nil {
		return fmt.Errorf("rabbitmq exchange %q: %w; create it (relay init does with sink.rabbitmq.declare: true)", exchange, err)
	}
	return nil
}

// Declare creates, when Config.Declare is set and the exchange template
// names one exchange, that exchange if it is missing (durable, of
// Config.ExchangeType) and the quorum queue Config.Queue bound to it with
// "#" if that is missing. It never changes an existing exchange, queue or
// binding: each is first declared passively. It returns one line saying
// what it did. It connects first, also when there is nothing to declare,
// so that relay run finds refused credentials at once.
func (s *Sink) Declare(ctx context.Context) (string, error) {
	c, err := s.connection(ctx)
	if err != nil {
		return "", err
	}
	if !s.cfg.Declare {
		return "rabbitmq: sink.rabbitmq.declare is off; nothing declared", nil
	}
	exchange := s.cfg.Exchange
	if !s.exchange.Fixed() || exchange == "" {
		return "rabbitmq: the exchange template " + exchange + " names no single exchange; nothing declared", nil
	}
	kind := s.cfg.ExchangeType
	if kind == "" {
		kind = "topic"
	}
	queue := s.cfg.Queue
	if queue == "" {
		queue = exchange
	}
	made := ""
	if err := c.passive(ctx, exchange); err != nil {
		if !isCode(err, amqp.NotFound) {
			return "", err
		}
		err = c.withChannel(ctx, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(exchange, kind, true, false, false, false, nil)
		})
		if err != nil && !isCode(err, amqp.PreconditionFailed) { // created meanwhile, otherwise
			return "", fmt.Errorf("declare exchange %q: %w", exchange, err)
		}
		made = "exchange " + exchange + " (" + kind + ") created"
	}
	err = c.withChannel(ctx, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	if err == nil {
		return summary(made, "queue "+queue+" exists, left as it is"), nil
	}
	if !isCode(err, amqp.NotFound) {
		return "", fmt.Errorf("queue %q: %w", queue, err)
	}
	err = c.withChannel(ctx, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			return err
		}
		return ch.QueueBind(queue, "#", exchange, false, nil)
	})
	if err != nil && !isCode(err, amqp.PreconditionFailed) {
		return "", fmt.Errorf("declare quorum queue %q bound to %q: %w", queue, exchange, err)
	}
	return summary(made, "quorum queue "+queue+" created, bound to "+exchange+" with #"), nil
}

func summary(parts ...string) string {
	out := "rabbitmq:"
	for _, p := range parts {
		if p != "" {
			out += " " + p + ";"
		}
	}
	if out == "rabbitmq:" {
		return "rabbitmq: exchange and queue exist"
	}
	return out[:len(out)-1]
}

// isCode reports whether err is an AMQP error with code.
func isCode(err error, code int) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code
}

// CredentialsRefused reports whether err says the broker refused the
// sink's user or password (403 ACCESS_REFUSED while connecting) or access
// to the virtual host.
func CredentialsRefused(err error) bool {
	var ae *amqp.Error
	if errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost) {
		return true
	}
	return errors.As(err, &ae) && ae.Code == amqp.AccessRefused && strings.Contains(ae.Reason, "refused using authentication mechanism") ||
		errors.As(err, &ae) && ae.Code == amqp.NotAllowed && strings.Contains(ae.Reason, "vhost")
}

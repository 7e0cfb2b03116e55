package sink

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/relay/internal/rowtext"
)

// The reasons a sink leaves a row header out, the values of the reason
// label of relay_row_headers_dropped_total.
const (
	// DropReserved is a row header named like a header or attribute the
	// relay sets itself (RelayHeaders, or the CloudEvents namespace with
	// an envelope), in any case.
	DropReserved = "reserved"
	// DropControl is a row header the broker or the protocol would act on
	// (see HeaderRules).
	DropControl = "control"
)

// DropReasons lists every reason, in a fixed order.
var DropReasons = []string{DropReserved, DropControl}

// RelayHeaders are the names of the headers and message attributes the
// relay sets on one sink or another. Every sink drops a row header with one
// of these names, compared without regard to case, so that a row can
// neither override nor shadow them, whatever sink it reaches.
var RelayHeaders = []string{
	"message_id", "event_type", "aggregate_type", "aggregate_id",
	"Nats-Msg-Id", "Idempotency-Key", "webhook-id", "webhook-timestamp", "webhook-signature",
	"Content-Type", "content_type", "body_encoding", "User-Agent",
}

// HeaderRules are the row header names one broker or protocol interprets
// (its control plane): a name equal to one of Names or starting with one of
// Prefixes, compared without regard to case.
type HeaderRules struct {
	Names    []string
	Prefixes []string
}

// The control headers of each sink's broker.
var (
	// NATSRules: every Nats-* header steers JetStream (rollups, per-message
	// TTLs, expected stream, subject and sequence, message ids, schedules,
	// traces), and the client reads Status and Description as the status
	// of a message (no responders, flow control, heartbeats).
	NATSRules = HeaderRules{Prefixes: []string{"Nats-"}, Names: []string{"Status", "Description"}}
	// KafkaRules: Kafka interprets no record header.
	KafkaRules = HeaderRules{}
	// SQSRules: SQS reserves message attribute names starting with AWS.
	// or Amazon.
	SQSRules = HeaderRules{Prefixes: []string{"AWS.", "Amazon."}}
	// RabbitMQRules: RabbitMQ routes a message to the extra routing keys
	// of its CC and BCC headers (sender-selected distribution, BCC removed
	// on delivery), and the broker and its plugins act on or set the
	// others: dead-lettering history, delayed and deduplicated messages,
	// stream filters, federation and shovels, AMQP 1.0 annotations.
	RabbitMQRules = HeaderRules{
		Names: []string{"CC", "BCC", "x-death", "x-delay", "x-deduplication-header", "x-stream-filter-value",
			"x-received-from", "x-match", "x-routing-key"},
		Prefixes: []string{"x-first-death-", "x-last-death-", "x-opt-"},
	}
	// RedisRules: a stream entry's payload field holds the body, and row
	// headers are fields beside it, so a row header cannot be named so.
	RedisRules = HeaderRules{Names: []string{"payload"}}
	// HTTPRules: the headers that frame the request or concern one
	// connection (hop-by-hop), which the HTTP client or a proxy acts on.
	HTTPRules = HeaderRules{
		Names: []string{"Host", "Content-Length", "Transfer-Encoding", "Content-Encoding", "Trailer", "TE",
			"Expect", "Connection", "Keep-Alive", "Upgrade", "HTTP2-Settings"},
		Prefixes: []string{"Proxy-"},
	}
)

// Control reports whether the broker interprets a header named name.
func (r HeaderRules) Control(name string) bool {
	for _, p := range r.Prefixes {
		if len(name) >= len(p) && strings.EqualFold(name[:len(p)], p) {
			return true
		}
	}
	return equalsAny(name, r.Names)
}

// equalsAny reports whether name equals one of names without regard to
// case.
func equalsAny(name string, names []string) bool {
	for _, n := range names {
		if strings.EqualFold(name, n) {
			return true
		}
	}
	return false
}

// HeaderFilter decides which row headers a sink forwards: none named like
// a header the relay sets (RelayHeaders, and names starting with the
// envelope's prefix when one is set) and none its broker interprets. It
// counts and logs what it drops in a HeaderDrops. Safe for concurrent use.
type HeaderFilter struct {
	rules    HeaderRules
	envelope string // the CloudEvents header prefix, or ""
	drops    *HeaderDrops
}

// NewHeaderFilter returns the filter of a sink whose broker interprets the
// headers of rules, with envelopePrefix ("ce_", "ce-") the namespace of
// the CloudEvents attributes when the sink adds them, else "". Drops are
// counted in drops, which may be nil: then they are only dropped.
func NewHeaderFilter(rules HeaderRules, envelopePrefix string, drops *HeaderDrops) *HeaderFilter {
	return &HeaderFilter{rules: rules, envelope: envelopePrefix, drops: drops}
}

// Reason returns why a row header named name is not forwarded, or "" when
// it is.
func (f *HeaderFilter) Reason(name string) string {
	switch {
	case equalsAny(name, RelayHeaders),
		f.envelope != "" && len(name) >= len(f.envelope) && strings.EqualFold(name[:len(f.envelope)], f.envelope):
		return DropReserved
	case f.rules.Control(name):
		return DropControl
	}
	return ""
}

// Forward reports whether the row header named name is forwarded; when it
// is not, it counts and logs the drop.
func (f *HeaderFilter) Forward(name string) bool {
	reason := f.Reason(name)
	if reason == "" {
		return true
	}
	f.drops.add(reason, name)
	return false
}

// HeaderDrops counts the row headers sinks drop, by reason, and logs them:
// at most one warning per reason per DropLogInterval, naming the last
// header dropped (escaped and cut to 64 bytes, rowtext.Label) and how many
// went since the previous warning. A nil *HeaderDrops counts nothing. Safe
// for concurrent use.
type HeaderDrops struct {
	log    *slog.Logger
	counts [2]atomic.Int64 // by index in DropReasons
	logged [2]atomic.Int64 // the counts at the last warning
	last   [2]atomic.Int64 // unix nanoseconds of the last warning
}

// DropLogInterval is the least time between two warnings about dropped row
// headers of one reason.
const DropLogInterval = time.Minute

// NewHeaderDrops returns counters logging to log; a nil log logs nothing.
func NewHeaderDrops(log *slog.Logger) *HeaderDrops { return &HeaderDrops{log: log} }

// LogDefaults returns the defaults of a sink's Logger and HeaderDrops
// options: log, or slog.Default() when nil, and drops, or counters of the
// sink's own logging to that logger when nil.
func LogDefaults(log *slog.Logger, drops *HeaderDrops) (*slog.Logger, *HeaderDrops) {
	if log == nil {
		log = slog.Default()
	}
	if drops == nil {
		drops = NewHeaderDrops(log)
	}
	return log, drops
}

// Count returns how many row headers were dropped for reason.
func (d *HeaderDrops) Count(reason string) int64 {
	if d == nil {
		return 0
	}
	return d.counts[reasonIndex(reason)].Load()
}

func reasonIndex(reason string) int {
	if reason == DropControl {
		return 1
	}
	return 0
}

func (d *HeaderDrops) add(reason, name string) {
	if d == nil {
		return
	}
	i := reasonIndex(reason)
	n := d.counts[i].Add(1)
	if d.log == nil {
		return
	}
	now, prev := time.Now().UnixNano(), d.last[i].Load()
	if prev != 0 && now-prev < int64(DropLogInterval) || !d.last[i].CompareAndSwap(prev, now) {
		return
	}
	since := n - d.logged[i].Swap(n)
	d.log.LogAttrs(context.Background(), slog.LevelWarn, "row header not forwarded",
		slog.String("header", rowtext.Label(name)), slog.String("reason", reason),
		slog.Int64("dropped_since_last_warning", since))
}

package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// outboxColumns are the columns the bench writes; created_at and seq take
// their defaults.
var outboxColumns = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers"}

const insertOne = `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
	VALUES ($1, $2, $3, $4, $5, $6)`

// eventHeaders is the headers column of every bench event: one small map,
// so header forwarding is part of the measured work.
const eventHeaders = `{"source":"relaybench"}`

// payloadFor returns a JSON object of exactly size bytes (as written; jsonb
// adds a space after each colon and comma on output) for aggregate agg.
func payloadFor(agg, step, size int) string {
	head := fmt.Sprintf(`{"order":"agg-%d","step":%d,"amount":%d,"pad":"`, agg, step, 100+step%9900)
	pad := size - len(head) - 2
	if pad < 0 {
		pad = 0
	}
	return head + strings.Repeat("x", pad) + `"}`
}

func aggregateID(agg int) string { return fmt.Sprintf("agg-%d", agg) }

// copyChunk is how many rows one COPY transaction inserts: a backlog
// written by many transactions, none large enough to spill logical
// decoding to disk.
const copyChunk = 10_000

// insertBacklog inserts n events over aggregates (drawn uniformly with a
// fixed seed) with COPY, copyChunk rows per transaction.
func insertBacklog(ctx context.Context, d *database, n, aggregates, payload int) error {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	steps := make(map[int]int, aggregates)
	headers := []byte(eventHeaders)
	for done := 0; done < n; {
		m := min(copyChunk, n-done)
		i := 0
		src := pgx.CopyFromFunc(func() ([]any, error) {
			if i == m {
				return nil, nil
			}
			i++
			agg := rng.IntN(aggregates)
			steps[agg]++
			var id [16]byte
			fillRandomUUID(rng, &id)
			return []any{pgtype.UUID{Bytes: id, Valid: true}, aggType, aggregateID(agg), "step",
				payloadFor(agg, steps[agg], payload), headers}, nil
		})
		if _, err := conn.CopyFrom(ctx, pgx.Identifier{"outbox"}, outboxColumns, src); err != nil {
			return fmt.Errorf("copy into outbox: %w", err)
		}
		done += m
	}
	return nil
}

func fillRandomUUID(rng *rand.Rand, id *[16]byte) {
	binary.LittleEndian.PutUint64(id[0:8], rng.Uint64())
	binary.LittleEndian.PutUint64(id[8:16], rng.Uint64())
	id[6] = id[6]&0x0f | 0x40 // version 4
	id[8] = id[8]&0x3f | 0x80 // RFC 4122 variant
}

// benchID is a message id that carries the steady-state phase it belongs
// to and its index in that phase's schedule, so that the consumer can find
// the intended send time from the message_id header alone: bytes 0–3 are
// the phase tag, bytes 10–15 the index, the rest random, version 4.
func benchID(tag uint32, idx int, rng *rand.Rand) [16]byte {
	var id [16]byte
	fillRandomUUID(rng, &id)
	binary.BigEndian.PutUint32(id[0:4], tag)
	var ib [8]byte
	binary.BigEndian.PutUint64(ib[:], uint64(idx))
	copy(id[10:16], ib[2:8])
	return id
}

// parseBenchID reverses benchID on the canonical text form of a UUID.
func parseBenchID(s string) (tag uint32, idx int, ok bool) {
	if len(s) != 36 {
		return 0, 0, false
	}
	var b [16]byte
	j := 0
	for i := 0; i < 36; {
		if s[i] == '-' {
			i++
			continue
		}
		hi, ok1 := unhex(s[i])
		lo, ok2 := unhex(s[i+1])
		if !ok1 || !ok2 || j >= 16 {
			return 0, 0, false
		}
		b[j] = hi<<4 | lo
		j++
		i += 2
	}
	var ib [8]byte
	copy(ib[2:8], b[10:16])
	return binary.BigEndian.Uint32(b[0:4]), int(binary.BigEndian.Uint64(ib[:])), true
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// prepareBacklog makes a freshly inserted backlog look like one that has
// been sitting in a production table: vacuumed (hint bits set, visibility
// map current), analyzed, and checkpointed so that no checkpoint falls into
// the timed phase.
func prepareBacklog(ctx context.Context, d *database) error {
	if err := d.exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		return err
	}
	return d.exec(ctx, "CHECKPOINT")
}

// resetOutbox empties the outbox (with the relay stopped).
func resetOutbox(ctx context.Context, d *database) error {
	return d.exec(ctx, "TRUNCATE outbox")
}

// rate is a count over a duration.
type rate struct {
	Events    int64   `json:"events"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"events_per_second"`
}

func newRate(n int64, d time.Duration) rate {
	r := rate{Events: n, Seconds: d.Seconds()}
	if d > 0 {
		r.PerSecond = float64(n) / d.Seconds()
	}
	return r
}

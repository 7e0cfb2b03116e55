package wal

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/internal/claim"
	"github.com/outboxrelay/relay/internal/schema"
)

// # Draining an outbox without seq
//
// The claims of a drain (capture/internal/claim) order and bound the rows
// by seq. An outbox table that lacks seq, headers or created_at (one made
// for Debezium, see schema.Info.Missing) is drained by a scan instead: when
// the drain starts, it lists the ids of every unpublished row in the table
// in commit order as far as the table tells it (seq when the table has it,
// else the age of the inserting transaction, oldest first, then the row's
// place in the table), and hands them out in batches of rows read again by
// id. A row committed after the slot was created is both drained and
// streamed: it is published twice, never out of order, as the drain ends
// before the stream begins. Ordering by transaction age holds within the
// last 2^31 transactions (frozen rows count as oldest, in table order); rows
// of one aggregate inserted by concurrent transactions are ordered by
// transaction id, which need not be their commit order. A batch that fails
// to archive, or is abandoned, makes the scan fail once every batch
// settled, and the next start scans the table again.

// scan is a drain's batch source for an outbox lacking a column claims
// need. Next is called by one goroutine; batches settle from others.
type scan struct {
	src    *Source
	listed bool
	ids    []string // listed and not handed out yet

	mu          sync.Mutex
	outstanding int  // batches handed out and not settled
	failed      bool // a batch failed to archive or was abandoned
}

func newScan(src *Source) *scan { return &scan{src: src} }

// Next returns the next batch of listed rows still unpublished, or
// claim.ErrDrained once every listed row was handed out; once those
// batches settled, it fails if one of them did not archive.
func (c *scan) Next(ctx context.Context) (capture.Batch, error) {
	if !c.listed {
		if err := c.list(ctx); err != nil {
			return nil, err
		}
		c.listed = true
	}
	for len(c.ids) > 0 {
		n := min(len(c.ids), c.src.opts.BatchSize)
		b, err := c.read(ctx, c.ids[:n])
		if err != nil {
			return nil, err
		}
		c.ids = c.ids[n:]
		if b.rows() > 0 {
			c.mu.Lock()
			c.outstanding++
			c.mu.Unlock()
			return &scanned{batch: b, scan: c}, nil
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.outstanding == 0 && c.failed {
		return nil, errors.New("rows of the outbox drain were not archived; draining again")
	}
	return nil, claim.ErrDrained
}

// Close releases nothing: the scan holds no connection.
func (c *scan) Close() error { return nil }

// list reads the ids of the unpublished rows in order.
func (c *scan) list(ctx context.Context) error {
	l, info := c.src.layout, c.src.info
	order := "age(xmin) DESC, ctid"
	if !info.Lacks(l.Cols.Seq) {
		order = schema.Q(l.Cols.Seq)
	}
	rows, _ := c.src.opts.Pool.Query(ctx, fmt.Sprintf(`SELECT %s::text FROM %s WHERE true %s ORDER BY %s`,
		schema.Q(l.Cols.ID), l.Outbox.Ident(), l.Unpublished(c.src.opts.ArchiveMode, ""), order))
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list the outbox rows to drain: %w", err)
	}
	c.ids = ids
	return nil
}

// read returns a batch of the rows with ids still unpublished, in the
// order of ids, decoded as the stream decodes rows.
func (c *scan) read(ctx context.Context, ids []string) (*batch, error) {
	l, info := c.src.layout, c.src.info
	dec := newDecoder(l, info.Missing)
	exprs := []string{schema.Q(l.Cols.ID) + "::text"}
	for k, name := range dec.names {
		switch {
		case name == "":
			exprs = append(exprs, "NULL")
		case k == fCreatedAt:
			exprs = append(exprs, fmt.Sprintf(`to_char(%s AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')`, schema.Q(name)))
		default:
			exprs = append(exprs, schema.Q(name)+"::text")
		}
	}
	rows, err := c.src.opts.Pool.Query(ctx, fmt.Sprintf(`SELECT %s FROM %s WHERE %s = ANY($1::text[]::%s[]) %s`,
		strings.Join(exprs, ", "), l.Outbox.Ident(), schema.Q(l.Cols.ID), info.Types[l.Cols.ID], l.Unpublished(c.src.opts.ArchiveMode, "")), ids)
	if err != nil {
		return nil, fmt.Errorf("read outbox rows to drain: %w", err)
	}
	defer rows.Close()
	found := make(map[string][][]byte, len(ids))
	for rows.Next() {
		raw := rows.RawValues()
		vals := make([][]byte, len(raw))
		for i, v := range raw {
			if v != nil {
				vals[i] = append([]byte{}, v...)
			}
		}
		found[string(vals[0])] = vals[1:]
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read outbox rows to drain: %w", err)
	}
	rel := &relation{outbox: true, contentType: info.ContentType}
	if info.Types[l.Cols.Payload] == "bytea" {
		rel.payloadType = oidBytea
	}
	b := &batch{src: c.src}
	for _, id := range ids {
		vals, ok := found[id]
		if !ok {
			continue // archived or deleted meanwhile
		}
		copy(dec.vals[:], vals)
		b.add(dec.row(rel))
	}
	return b, nil
}

// settle records that b settled, archived when ok.
func (c *scan) settle(ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.outstanding--
	c.failed = c.failed || !ok
}

// scanned is a batch of a scan: it archives as the stream's batches do,
// without a slot position to confirm.
type scanned struct {
	*batch
	scan *scan
	once sync.Once
}

// Complete archives the batch's rows and dead-letters its dead ones.
func (b *scanned) Complete(ctx context.Context, o capture.Outcome) error {
	err := b.archive(ctx, o)
	b.once.Do(func() { b.scan.settle(err == nil) })
	return err
}

// Abandon leaves the batch's rows in the outbox: the scan fails once
// every batch settled, and the next scan hands them out again.
func (b *scanned) Abandon(context.Context) { b.once.Do(func() { b.scan.settle(false) }) }

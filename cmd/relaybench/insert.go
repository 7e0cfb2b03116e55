package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/relay/internal/schema"
)

// InsertCost is what each outbox table variant costs the application's
// single-row INSERT transactions (insert phase).
type InsertCost struct {
	Pinning  string         `json:"pinning"`
	Pinned   bool           `json:"pinned"`
	Clients  int            `json:"clients"`
	Variants []InsertResult `json:"variants"`
}

// InsertResult is one variant's run: Clients connections, each committing
// single-row INSERT transactions with synchronous_commit off, for Seconds,
// into a fresh table of the variant with autovacuum off.
type InsertResult struct {
	Variant string `json:"variant"`
	What    string `json:"what"`
	// Loses names the guarantee the variant gives up; empty: none.
	Loses           string      `json:"loses,omitempty"`
	Inserts         int64       `json:"inserts"`
	Seconds         float64     `json:"seconds"`
	PerSecond       float64     `json:"inserts_per_second"`
	Latency         Percentiles `json:"commit_latency"`
	PostgresPer100k float64     `json:"postgres_cpu_seconds_per_100k"`
	WALBytes        int64       `json:"wal_bytes"`
	WALPerInsert    float64     `json:"wal_bytes_per_insert"`
	// OwnWALPerInsert is the part of WALPerInsert that is this database's:
	// the records of its relations and those of no relation (commits),
	// without the WAL page headers and what the cluster's other databases
	// wrote meanwhile (autovacuum). WALByKind is it by resource manager
	// (Heap, Btree, Transaction, …), full-page images apart under
	// fullPages. Both are from pg_walinspect; 0 and empty when the
	// extension is missing.
	OwnWALPerInsert float64            `json:"own_wal_bytes_per_insert,omitempty"`
	WALByKind       map[string]float64 `json:"own_wal_bytes_per_insert_by_kind,omitempty"`
	walKinds        map[string]int64
	// Rows and SizeBytes are the table's rows after the run and the size
	// of its heap and indexes (of every partition), SizePer100k that size
	// per 100,000 rows.
	Rows        int64   `json:"rows"`
	SizeBytes   int64   `json:"size_bytes"`
	SizePer100k float64 `json:"size_bytes_per_100k_rows"`
	CPU         cpuUse  `json:"cpu"`
}

// insertVariant is an outbox table of the insert phase: the statements
// creating it, and the headers of every row it gets (eventHeaders, nil
// for NULL, or "{}").
type insertVariant struct {
	name, what, loses string
	ddl               []string
	headers           any
}

// benchLayout is the outbox of the bench with the default column names.
var benchLayout = schema.Layout{
	Outbox: schema.Table{Schema: "public", Name: "outbox"},
	Cols: schema.Columns{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type",
		Payload: "payload", Headers: "headers", CreatedAt: "created_at", Seq: "seq"},
}

// Ring partitions of the partition variant: LIST partitions on
// (seq / ringRows) % ringParts.
const (
	ringParts = 8
	ringRows  = 100_000
)

// insertVariants returns the tables of the insert phase, the first the
// outbox `relay init` creates (internal/schema), the others derived from
// it.
func insertVariants() []insertVariant {
	l := benchLayout
	table, seqIdx := l.CreateOutbox(), l.CreatePollIndex()
	plain := fmt.Sprintf(`CREATE INDEX outbox_seq_plain_idx ON outbox (%s)`, schema.Q(l.Cols.Seq))
	def := insertVariant{name: "default", what: "relay init: id uuid PRIMARY KEY, UNIQUE (seq), seq identity, jsonb",
		ddl: []string{table, seqIdx}, headers: eventHeaders}
	return []insertVariant{
		def,
		{name: "seq_plain", what: "seq index not UNIQUE", loses: "the watermark without pg_locks: every claim reads the open writers",
			ddl: []string{table, plain}, headers: eventHeaders},
		{name: "id_only", what: "no seq index, id PRIMARY KEY only", loses: "the poll index: claims and poll archives read the whole outbox, every claim reads pg_locks",
			ddl: []string{table}, headers: eventHeaders},
		{name: "seq_only", what: "no id index (id uuid NOT NULL), UNIQUE (seq)", loses: "unique ids; wal mode's look-ups by id read the whole outbox",
			ddl: []string{replaced(table, "uuid PRIMARY KEY", "uuid NOT NULL"), seqIdx}, headers: eventHeaders},
		{name: "bigserial", what: "seq bigserial instead of identity", ddl: []string{replaced(table, "bigint GENERATED ALWAYS AS IDENTITY", "bigserial"), seqIdx},
			headers: eventHeaders},
		{name: "headers_null", what: "default table, headers NULL", ddl: def.ddl, headers: nil},
		{name: "headers_empty", what: "default table, headers '{}'", ddl: def.ddl, headers: "{}"},
		{name: "payload_json", what: "payload json instead of jsonb", loses: "the contract's jsonb (relay init creates it)",
			ddl: []string{replaced(table, schema.Q(l.Cols.Payload)+" jsonb", schema.Q(l.Cols.Payload)+" json"), seqIdx}, headers: eventHeaders},
		{name: "notify", what: "default + the insert notify trigger (capture.poll.notify)", ddl: append(slices.Clone(def.ddl), l.CreateNotifyTrigger()...),
			headers: eventHeaders},
		{name: "ring8", what: fmt.Sprintf("%d LIST partitions on (seq/%d)%%%d, UNIQUE (id) and UNIQUE (seq) per partition", ringParts, ringRows, ringParts),
			loses: "ids are unique per partition only", ddl: ringDDL(table), headers: eventHeaders},
	}
}

// ringDDL returns the statements creating the partition ring from table,
// the default outbox's CREATE TABLE.
func ringDDL(table string) []string {
	seq := schema.Q(benchLayout.Cols.Seq)
	stmts := []string{replaced(table, "uuid PRIMARY KEY", "uuid NOT NULL") +
		fmt.Sprintf(" PARTITION BY LIST (((%s / %d) %% %d))", seq, ringRows, ringParts)}
	for i := range ringParts {
		stmts = append(stmts,
			fmt.Sprintf(`CREATE TABLE outbox_p%d PARTITION OF outbox FOR VALUES IN (%d)`, i, i),
			fmt.Sprintf(`CREATE UNIQUE INDEX outbox_p%d_id_idx ON outbox_p%d (%s)`, i, i, schema.Q(benchLayout.Cols.ID)),
			fmt.Sprintf(`CREATE UNIQUE INDEX outbox_p%d_seq_idx ON outbox_p%d (%s)`, i, i, seq))
	}
	return stmts
}

// replaced returns s with the first old replaced by repl; it panics when s
// has no old, as the default outbox's DDL then changed under the variants.
func replaced(s, old, repl string) string {
	if !strings.Contains(s, old) {
		panic(fmt.Sprintf("relaybench: the outbox DDL has no %q:\n%s", old, s))
	}
	return strings.Replace(s, old, repl, 1)
}

// selectedVariants returns the variants named in names, all when names is
// empty, or an error naming an unknown one.
func selectedVariants(names []string) ([]insertVariant, error) {
	all := insertVariants()
	if len(names) == 0 {
		return all, nil
	}
	var out []insertVariant
	for _, n := range names {
		i := slices.IndexFunc(all, func(v insertVariant) bool { return v.name == n })
		if i < 0 {
			return nil, fmt.Errorf("unknown insert variant %q (%s)", n, strings.Join(variantNames(all), ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}

func variantNames(vs []insertVariant) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.name)
	}
	return out
}

// insertCost runs the insert load on each variant in a fresh database,
// with PostgreSQL pinned to CPU 0 (insert phase).
func (b *bench) insertCost(ctx context.Context) error {
	if !b.opts.has("insert") {
		return nil
	}
	variants, err := selectedVariants(b.opts.InsertVariants)
	if err != nil {
		return err
	}
	ic := &InsertCost{Clients: b.opts.InsertClients}
	b.res.Insert = ic
	var restore func()
	ic.Pinned, ic.Pinning, restore = b.pin()
	defer restore()
	b.opts.logf("insert: %s", ic.Pinning)
	for _, v := range variants {
		r, err := b.insertRun(ctx, v)
		if err != nil {
			return fmt.Errorf("insert, %s: %w", v.name, err)
		}
		ic.Variants = append(ic.Variants, r)
		b.opts.logf("insert, %s: %.0f inserts/s, postgres CPU %.2f s/100k, %.0f WAL bytes/insert, %.1f MB/100k rows",
			v.name, r.PerSecond, r.PostgresPer100k, r.WALPerInsert, r.SizePer100k/1e6)
	}
	return nil
}

// outboxLeaves selects the tables holding the outbox's rows: the outbox, or
// its partitions.
const outboxLeaves = `SELECT oid::regclass FROM pg_class WHERE oid = 'outbox'::regclass AND relkind = 'r'
	UNION ALL SELECT relid FROM pg_partition_tree('outbox') WHERE isleaf`

// insertRun creates variant v in a fresh database and runs the insert
// load on it.
func (b *bench) insertRun(ctx context.Context, v insertVariant) (InsertResult, error) {
	res := InsertResult{Variant: v.name, What: v.what, Loses: v.loses}
	d, err := b.newDatabase(ctx, "insert_"+v.name, "poll")
	if err != nil {
		return res, err
	}
	defer b.dropDatabase(d)
	for _, s := range v.ddl {
		if err := d.exec(ctx, s); err != nil {
			return res, err
		}
	}
	// Autovacuum would write WAL of its own while the load runs: off on
	// the outbox, and nothing left for it in the catalogs the DDL changed.
	if err := d.exec(ctx, `DO $$DECLARE r regclass; BEGIN
		FOR r IN `+outboxLeaves+` LOOP
			EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', r);
		END LOOP; END$$`); err != nil {
		return res, err
	}
	if err := d.exec(ctx, "VACUUM"); err != nil {
		return res, err
	}
	inspect := d.exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect") == nil
	conns, err := b.insertConns(ctx, d, v)
	defer closeConns(conns)
	if err != nil {
		return res, err
	}
	lsn0, err := d.currentLSN(ctx)
	if err != nil {
		return res, err
	}
	cpu0 := sampleCPU()
	n, el, hist, err := closedLoop(len(conns), 17, b.opts.InsertFor, func(w int, rng *rand.Rand, i int) error {
		return insertRow(ctx, conns[w], rng, uint32(w), i, b.opts.Aggregates, b.opts.Payload, v.headers)
	})
	if err != nil {
		return res, err
	}
	res.CPU = cpuBetween(cpu0, sampleCPU(), 0)
	lsn1, err := d.currentLSN(ctx)
	if err != nil {
		return res, err
	}
	res.Inserts, res.Seconds, res.Latency = n, el.Seconds(), hist.summary()
	res.PerSecond = newRate(n, el).PerSecond
	if err := d.pool.QueryRow(ctx, `SELECT ($2::pg_lsn - $1::pg_lsn)::bigint`, lsn0, lsn1).Scan(&res.WALBytes); err != nil {
		return res, err
	}
	if inspect {
		if res.walKinds, err = walKinds(ctx, d, lsn0, lsn1); err != nil {
			return res, err
		}
	}
	err = d.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox),
		(SELECT sum(pg_total_relation_size(r))::bigint FROM (`+outboxLeaves+`) AS leaves (r))`).Scan(&res.Rows, &res.SizeBytes)
	res.perInsert()
	return res, err
}

// perInsert sets the run's costs per insert and per 100,000 inserts and
// rows from its totals.
func (res *InsertResult) perInsert() {
	n := max(float64(res.Inserts), 1)
	res.WALPerInsert = float64(res.WALBytes) / n
	res.PostgresPer100k = res.CPU.PostgresSeconds * 100_000 / n
	res.SizePer100k = float64(res.SizeBytes) * 100_000 / max(float64(res.Rows), 1)
	if len(res.walKinds) > 0 {
		res.WALByKind = map[string]float64{}
		for k, v := range res.walKinds {
			res.WALByKind[k] = float64(v) / n
			res.OwnWALPerInsert += float64(v) / n
		}
	}
}

// fullPages is the WALByKind entry of the full-page images.
const fullPages = "full-page images"

// walKinds returns the WAL between lsn0 and lsn1 of d's relations and of
// no relation by resource manager, records only, and their full-page
// images apart, once the WAL up to lsn1 is flushed (pg_walinspect reads
// only flushed WAL).
func walKinds(ctx context.Context, d *database, lsn0, lsn1 string) (map[string]int64, error) {
	err := waitFor(ctx, 30*time.Second, nil, func() (flushed bool, err error) {
		err = d.pool.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn`, lsn1).Scan(&flushed)
		return flushed, err
	})
	if err != nil {
		return nil, fmt.Errorf("wait for the WAL up to %s to be flushed: %w", lsn1, err)
	}
	// A block reference reads "blkref #0: rel <tablespace>/<database>/<relation> …".
	rows, err := d.pool.Query(ctx, `SELECT rm, sum(rl)::bigint, sum(fl)::bigint
		FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) AS r (s, e, p, xid, rm, rt, rl, ml, fl, descr, br)
		WHERE coalesce(br, '') = '' OR br LIKE '%rel %/' ||
			(SELECT oid FROM pg_database WHERE datname = current_database())::text || '/%'
		GROUP BY rm`, lsn0, lsn1)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var kind string
	var rec, fpi int64
	_, err = pgx.ForEachRow(rows, []any{&kind, &rec, &fpi}, func() error {
		out[kind] += rec
		out[fullPages] += fpi
		return nil
	})
	return out, err
}

// insertConns opens opts.InsertClients connections to d with
// synchronous_commit off, each having inserted one row into v's table (the
// prepared statement and the backend's caches are warm).
func (b *bench) insertConns(ctx context.Context, d *database, v insertVariant) ([]*pgx.Conn, error) {
	var conns []*pgx.Conn
	for w := range b.opts.InsertClients {
		c, err := pgx.Connect(ctx, d.dsn)
		if err != nil {
			return conns, err
		}
		conns = append(conns, c)
		if _, err := c.Exec(ctx, "SET synchronous_commit = off"); err != nil {
			return conns, err
		}
		rng := rand.New(rand.NewPCG(uint64(w), 3))
		if err := insertRow(ctx, c, rng, 0xfffffffd, w, b.opts.Aggregates, b.opts.Payload, v.headers); err != nil {
			return conns, err
		}
	}
	return conns, nil
}

func closeConns(conns []*pgx.Conn) {
	for _, c := range conns {
		c.Close(context.Background())
	}
}

// insertRow commits one single-row INSERT transaction on c with headers
// as the headers column.
func insertRow(ctx context.Context, c *pgx.Conn, rng *rand.Rand, tag uint32, idx, aggregates, payload int, headers any) error {
	agg := rng.IntN(aggregates)
	id := benchID(tag, idx, rng)
	_, err := c.Exec(ctx, insertOne, pgtype.UUID{Bytes: id, Valid: true}, aggType, aggregateID(agg), "step",
		payloadFor(agg, idx, payload), headers)
	return err
}

// printInsert prints the insert phase's variants, with WAL bytes and size
// relative to the first (the default).
func printInsert(w io.Writer, r *Results) {
	ic := r.Insert
	if ic == nil || len(ic.Variants) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s; %d clients, single-row INSERT transactions, synchronous_commit off\n", ic.Pinning, ic.Clients)
	t := newTable(w, "WHAT AN OUTBOX ROW COSTS THE INSERT", "inserts/s", "p99 ms", "postgres CPU s/100k", "WAL B/insert",
		"own B/insert", "own ×", "heap", "btree", "commit", "FPI", "MB/100k rows", "size ×", "other CPU s", "gives up")
	base := ic.Variants[0]
	for _, v := range ic.Variants {
		loses := v.Loses
		if loses == "" {
			loses = "nothing"
		}
		cells := []string{v.Variant, f0(v.PerSecond), f2(v.Latency.P99), f2(v.PostgresPer100k), f0(v.WALPerInsert)}
		cells = append(cells, walKindCells(v, base)...)
		t.row(append(cells, f1(v.SizePer100k/1e6), ratioCell(v.SizePer100k/max(base.SizePer100k, 1)), f1(v.CPU.OtherSeconds), loses)...)
	}
	t.flush()
}

// walKindCells returns v's own WAL bytes per insert, its ratio to base's,
// and its heap, btree, commit and full-page image parts, "-" each when
// they were not measured.
func walKindCells(v, base InsertResult) []string {
	k := v.WALByKind
	if len(k) == 0 {
		return []string{"-", "-", "-", "-", "-", "-"}
	}
	return []string{f1(v.OwnWALPerInsert), ratioCell(v.OwnWALPerInsert / max(base.OwnWALPerInsert, 1)),
		f1(k["Heap"] + k["Heap2"]), f1(k["Btree"]), f1(k["Transaction"]), f1(k[fullPages])}
}

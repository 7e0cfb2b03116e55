package idempotency

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultTable is the table of NewStore with an empty name.
const DefaultTable = "public.idempotency_keys"

// purgeBatch is how many expired keys one statement of Purge deletes.
const purgeBatch = 1000

// DB is what a Store uses: a *pgxpool.Pool. The middleware begins one
// transaction per request on it.
type DB interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Store keeps the stored responses of idempotency keys in a table, one row
// per caller and key. It is immutable and safe for concurrent use.
type Store struct {
	db     DB
	ident  string   // the quoted table name
	ddl    []string // CREATE TABLE, CREATE INDEX
	lookup string   // the stored response of a caller's key, unless expired
	save   string   // insert, or replace an expired row
	purge  string   // delete a batch of expired rows
}

// NewStore returns the store of table on db: table is "name" or
// "schema.name", a name without a schema being in public; "" is
// DefaultTable. Identifiers are always quoted.
func NewStore(db DB, table string) (*Store, error) {
	table = cmp.Or(table, DefaultTable)
	schema, name, ok := strings.Cut(table, ".")
	if !ok {
		schema, name = "public", table
	}
	if schema == "" || name == "" {
		return nil, fmt.Errorf("idempotency: table %q: want name or schema.name", table)
	}
	t := pgx.Identifier{schema, name}.Sanitize()
	return &Store{
		db:    db,
		ident: t,
		ddl: []string{
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  caller      text        NOT NULL,
  key         text        NOT NULL,
  fingerprint bytea       NOT NULL,
  status      int         NOT NULL,
  headers     jsonb       NOT NULL,
  body        bytea       NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  expires_at  timestamptz NOT NULL,
  PRIMARY KEY (caller, key)
)`, t),
			fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (expires_at)",
				pgx.Identifier{name + "_expires_at_idx"}.Sanitize(), t),
		},
		lookup: fmt.Sprintf(`SELECT fingerprint, status, headers, body FROM %s
  WHERE caller = $1 AND key = $2 AND expires_at > now()`, t),
		save: fmt.Sprintf(`INSERT INTO %[1]s AS k (caller, key, fingerprint, status, headers, body, expires_at)
  VALUES ($1, $2, $3, $4, $5, $6, now() + $7::bigint * interval '1 microsecond')
  ON CONFLICT (caller, key) DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status,
    headers = excluded.headers, body = excluded.body, created_at = excluded.created_at,
    expires_at = excluded.expires_at
  WHERE k.expires_at <= now()`, t),
		purge: fmt.Sprintf(`DELETE FROM %[1]s WHERE (caller, key) IN (
  SELECT caller, key FROM %[1]s WHERE expires_at <= now() LIMIT %d FOR UPDATE SKIP LOCKED)`, t, purgeBatch),
	}, nil
}

// DDL returns the statements that CreateTable runs, for a migration tool.
func (s *Store) DDL() string { return strings.Join(s.ddl, ";\n") + ";\n" }

// CreateTable creates the table and its expires_at index when missing. Run
// it once, at startup or in a migration: concurrent first runs of CREATE
// TABLE IF NOT EXISTS can fail in PostgreSQL.
func (s *Store) CreateTable(ctx context.Context) error {
	for _, stmt := range s.ddl {
		if _, err := s.db.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("idempotency: create %s: %w", s.ident, err)
		}
	}
	return nil
}

// Purge deletes the expired keys, a thousand per statement so that no
// statement holds many locks, and returns how many it deleted. Run it
// periodically (an expired key is ignored by the middleware, so Purge only
// reclaims space); it is safe to run concurrently with requests and with
// other Purges.
func (s *Store) Purge(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := s.db.Exec(ctx, s.purge)
		if err != nil {
			return total, fmt.Errorf("idempotency: purge %s: %w", s.ident, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < purgeBatch {
			return total, nil
		}
	}
}

// stored is a completed request's response.
type stored struct {
	fingerprint []byte
	status      int
	header      http.Header
	body        []byte
}

var errBusy = errors.New("idempotency key in use")

// acquire takes the transaction-scoped lock of the caller's key in tx and
// returns the key's stored response, nil when there is none or it expired.
// It returns errBusy when another transaction holds the lock: a request
// with the key is running. The lock is taken before the lookup, in its own
// statement, so that at READ COMMITTED the lookup sees a response that the
// lock's previous holder committed.
func (s *Store) acquire(ctx context.Context, tx pgx.Tx, caller, key string) (*stored, error) {
	var locked bool
	lockID := s.ident + "|" + strconv.Itoa(len(caller)) + "|" + caller + "|" + key
	if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))", lockID).Scan(&locked); err != nil {
		return nil, fmt.Errorf("idempotency: lock key: %w", err)
	}
	if !locked {
		return nil, errBusy
	}
	var r stored
	var header []byte
	err := tx.QueryRow(ctx, s.lookup, caller, key).Scan(&r.fingerprint, &r.status, &header, &r.body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err == nil {
		err = json.Unmarshal(header, &r.header)
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency: look up key in %s: %w", s.ident, err)
	}
	return &r, nil
}

// store saves the response of the caller's key in tx, to expire after ttl.
// It returns errBusy when a live response of the key exists, which the
// lock of acquire prevents.
func (s *Store) store(ctx context.Context, tx pgx.Tx, caller, key string, r *stored, ttl time.Duration) error {
	header, err := json.Marshal(r.header)
	if err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, s.save, caller, key, r.fingerprint, r.status, header, r.body, ttl.Microseconds())
	if err != nil {
		return fmt.Errorf("idempotency: store key in %s: %w", s.ident, err)
	}
	if tag.RowsAffected() != 1 {
		return errBusy
	}
	return nil
}

package claim

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"unsafe"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
)

// blockBytes returns the bytes of the scanner's current blocks of events
// and payload bytes.
func blockBytes(sc *scanner, eventsTaken int) int {
	return cap(sc.bytes) + (cap(sc.events)+eventsTaken)*int(unsafe.Sizeof(event.Event{}))
}

// TestOneRowClaimPinsLittle scans a claim of one row with a 200-byte
// payload: its event and payload blocks hold about that row, not the blocks
// of a full claim.
func TestOneRowClaimPinsLittle(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	payload := `{"pad": "` + strings.Repeat("x", 189) + `"}`
	rows, err := conn.Query(ctx, `SELECT gen_random_uuid()::text, 'order'::text, 'a'::text, 'created'::text, $1::jsonb,
		'{"source": "x"}'::jsonb, now(), 1::bigint`, payload)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	b := &batch{}
	for rows.Next() {
		if err := b.scan(rows, event.ContentTypeJSON); err != nil {
			t.Fatal(err)
		}
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(b.events) != 1 || string(b.events[0].Payload) != payload || !b.sc.raw {
		t.Fatalf("events %v (raw %v), want one with the payload", b.events, b.sc.raw)
	}
	limit := 2*len(payload) + firstEvents*int(unsafe.Sizeof(event.Event{}))
	if n := blockBytes(b.sc, 1); n > limit {
		t.Fatalf("a one-row claim holds blocks of %d bytes, want at most %d", n, limit)
	}
}

// TestScannerBlocks takes 500 events and payload copies of sizes from 0 to
// above a quarter block from a scanner, as a full claim does: every copy
// equals its payload, is not nil and has no spare capacity, and the blocks
// cost few allocations.
func TestScannerBlocks(t *testing.T) {
	sizes := []int{200, 0, 1, 3000, payloadBlock / 4, payloadBlock/4 + 1, 9000, 200, 200}
	src := make([][]byte, 500)
	for i := range src {
		src[i] = bytes.Repeat([]byte{byte(i)}, sizes[i%len(sizes)])
	}
	sc := &scanner{}
	evs := make([]*event.Event, len(src))
	for i, p := range src {
		evs[i] = sc.newEvent()
		evs[i].Payload = sc.copy(p)
	}
	for i, ev := range evs {
		if ev.Payload == nil || !bytes.Equal(ev.Payload, src[i]) || cap(ev.Payload) != len(src[i]) {
			t.Fatalf("copy %d: %d bytes, cap %d (nil %v), want %d", i, len(ev.Payload), cap(ev.Payload), ev.Payload == nil, len(src[i]))
		}
	}
	p := bytes.Repeat([]byte("x"), 200)
	allocs := testing.AllocsPerRun(10, func() {
		sc := &scanner{}
		for range 500 {
			sc.newEvent().Payload = sc.copy(p)
		}
	})
	if allocs > 40 {
		t.Fatalf("500 events of 200 bytes: %.0f allocations, want at most 40", allocs)
	}
}

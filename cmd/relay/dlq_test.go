package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestDLQInspect covers what on-call needs from the dead-letter tools, in
// a SQL_ASCII database whose dead letter holds a webhook's 503 with a long
// receiver body, a terminal escape and an invalid byte in its error:
// `relay dlq list` shows the whole error (escaped), `list --json` and
// `show --json` hold it whole with U+FFFD for the invalid byte and name
// the column in invalid_utf8, `show ID` prints every column with the
// payload and headers, and an unknown id exits 1. `dlq redrive` with the
// service config (relay run's role, which does not insert into the outbox)
// exits 1 before changing anything, naming INSERT on the outbox, why, and
// the GRANT; once granted, it redrives, and says how many in --json.
func TestDLQInspect(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{DSN: testenv.NewDB(t, sqlASCII), LeastPrivilege: true})
	ctx := context.Background()
	id := uuid.NewString()
	body := strings.Repeat("receiver says no; ", 20) + "END-OF-BODY"
	if _, err := s.pool.Exec(ctx, `INSERT INTO outbox_dead_letter
		(id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, error, error_class, attempts, first_failed_at, last_failed_at)
		VALUES ($1, 'order', 'o-1', 'placed', '{"order": 42}', '{"traceparent": "00-abc-01"}', now(),
		  'webhook POST https://hooks.example/orders: 503 Service Unavailable: ' || $2 || E' \x1b[31m\xff', 'transient', 10, now(), now())`,
		id, body); err != nil {
		t.Fatal(err)
	}

	out, code := runRelay(t, "dlq", "list", "--config", s.cfgPath)
	if code != 0 || !strings.Contains(out, "503 Service Unavailable") || !strings.Contains(out, `END-OF-BODY \x1b[31m\xff`) ||
		strings.ContainsAny(out, "\x1b\xff") {
		t.Fatalf("dlq list: exit %d, want the whole error escaped\n%s", code, out)
	}

	out, code = runRelay(t, "dlq", "list", "--json", "--config", s.cfgPath)
	var list []struct {
		ID          string   `json:"id"`
		Error       string   `json:"error"`
		ErrorClass  string   `json:"error_class"`
		Attempts    int      `json:"attempts"`
		InvalidUTF8 []string `json:"invalid_utf8"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list) != 1 || list[0].ID != id ||
		!strings.HasSuffix(list[0].Error, "END-OF-BODY \x1b[31m\uFFFD") || list[0].Attempts != 10 ||
		strings.Join(list[0].InvalidUTF8, ",") != "error" {
		t.Fatalf("dlq list --json: exit %d, %v\n%s", code, err, out)
	}

	out, code = runRelay(t, "dlq", "show", id, "--config", s.cfgPath)
	for _, want := range []string{"payload", `{"order": 42}`, "headers", `{"traceparent": "00-abc-01"}`, "attempts", "first_failed_at",
		"503 Service Unavailable: receiver says no", `END-OF-BODY \x1b[31m\xff`} {
		if !strings.Contains(out, want) {
			t.Errorf("dlq show lacks %s", want)
		}
	}
	if code != 0 || strings.ContainsAny(out, "\x1b\xff") {
		t.Fatalf("dlq show: exit %d\n%s", code, out)
	}
	t.Logf("relay dlq show:\n%s", out)

	out, code = runRelay(t, "dlq", "show", "--json", "--config", s.cfgPath, "--id", id)
	var shown []struct {
		Values      map[string]*string `json:"values"`
		Types       map[string]string  `json:"types"`
		InvalidUTF8 []string           `json:"invalid_utf8"`
	}
	if err := json.Unmarshal([]byte(out), &shown); code != 0 || err != nil || len(shown) != 1 {
		t.Fatalf("dlq show --json: exit %d, %v\n%s", code, err, out)
	}
	if v := shown[0].Values; v["id"] == nil || *v["id"] != id || v["payload"] == nil || *v["payload"] != `{"order": 42}` ||
		v["headers"] == nil || *v["headers"] != `{"traceparent": "00-abc-01"}` || v["error"] == nil ||
		!strings.HasSuffix(*v["error"], "END-OF-BODY \x1b[31m\uFFFD") || shown[0].Types["payload"] != "jsonb" ||
		strings.Join(shown[0].InvalidUTF8, ",") != "error" {
		t.Fatalf("dlq show --json:\n%s", out)
	}

	if out, code := runRelay(t, "dlq", "show", uuid.NewString(), "--config", s.cfgPath); code != 1 || !strings.Contains(out, "no dead letter with id") {
		t.Errorf("dlq show of an unknown id: exit %d, want 1\n%s", code, out)
	}
	for _, args := range [][]string{{"dlq", "show", "--config", s.cfgPath}, {"dlq", "show", "nope", "--config", s.cfgPath},
		{"dlq", "list", id, "--config", s.cfgPath}} {
		if out, code := runRelay(t, args...); code != 2 {
			t.Errorf("relay %q: exit %d, want 2\n%s", args, code, out)
		}
	}

	out, code = runRelay(t, "dlq", "redrive", "--id", id, "--config", s.cfgPath)
	if code != 1 || !strings.Contains(out, `missing INSERT on table "public"."outbox"`) || !strings.Contains(out, "inserts the dead letters back into the outbox") ||
		!strings.Contains(out, `GRANT INSERT ON TABLE "public"."outbox" TO "`+s.role+`";`) {
		t.Fatalf("dlq redrive as relay run's role: exit %d, want 1 naming the GRANT\n%s", code, out)
	}
	if out, code := runRelay(t, "dlq", "list", "--config", s.cfgPath); !strings.Contains(out, id) {
		t.Fatalf("the refused redrive changed the dead letters: exit %d\n%s", code, out)
	}
	if _, err := s.pool.Exec(ctx, `GRANT INSERT ON outbox TO `+s.role); err != nil {
		t.Fatal(err)
	}
	out, code = runRelay(t, "dlq", "redrive", "--json", "--id", id, "--config", s.cfgPath)
	var redrove struct {
		Action string `json:"action"`
		Count  int64  `json:"count"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &redrove); code != 0 || err != nil || redrove.Action != "redrive" || redrove.Count != 1 {
		t.Fatalf("dlq redrive --json once granted: exit %d, %v\n%s", code, err, out)
	}
}

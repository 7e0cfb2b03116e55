package wal

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"
	"time"
	_ "time/tzdata" // the zones of TestParseTimestampMatchesTimeParse without the system's
)

// parseWithLayouts is parseTimestamp without its fast path.
func parseWithLayouts(s string) (time.Time, error) {
	for _, layout := range timestampLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("not a timestamp")
}

// timestampInputs returns what PostgreSQL prints for timestamptz and
// timestamp in every DateStyle ISO variant, random ones, and edge cases that
// must fail or take the slow path.
func timestampInputs() []string {
	in := []string{
		"2026-12-01 09:50:42.123456+00", "2026-12-01 09:50:42+00", "2026-12-01 09:50:42.1+00",
		"2026-12-01 09:50:42.12+02", "2026-12-01 09:50:42.000001-07", "2026-12-01 09:50:42.5+05:30",
		"1883-11-18 12:03:58-07:52:58", "2026-12-01 09:50:42.123456789+00", "2026-12-01 09:50:42.1234567891+00",
		"2026-12-01 09:50:42.123456", "2026-12-01 09:50:42", "2024-02-29 23:59:58.123456+00",
		"2023-02-29 00:00:00+00", "2100-02-29 00:00:00+00", "2000-02-29 00:00:00+00", "2026-04-31 00:00:00+00",
		"2026-13-01 00:00:00+00", "2026-00-01 00:00:00+00", "2026-01-00 00:00:00+00", "2026-01-01 24:00:00+00",
		"2026-01-01 23:60:00+00", "2026-01-01 23:59:60+00", "2026-01-01 9:59:59+00", "0044-03-15 12:00:00+00 BC",
		"0001-01-01 00:00:00+00", "0000-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00", "10000-01-01 00:00:00+00",
		"infinity", "-infinity", "", "2026-12-01", "2026-12-01T09:50:42Z", "2026-12-01 09:50:42Z",
		"2026-12-01 09:50:42,5+00", "2026-12-01 09:50:42.+00", "2026-12-01 09:50:42+1", "2026-12-01 09:50:42+0100",
		"2026-12-01 09:50:42+25", "2026-12-01 09:50:42+24", "2026-12-01 09:50:42+14:60", "2026-12-01 09:50:42*00",
		"2026-12-01 09:50:42+00:30:61", "2026-12-01 09:50:42-00", "2026-12-01 09:50:42+01:00:", "2026-12-01 09:50:42 +00",
		"2026-1a-01 09:50:42+00", "+026-12-01 09:50:42+00", "2026-12-01 09:50:42.123456+00:00", "2026-12-01 09:5:42+00",
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		t := time.Unix(r.Int64N(400*365*86400)-200*365*86400, 0).UTC()
		s := t.Format("2006-01-02 15:04:05")
		if d := r.IntN(10); d > 0 {
			s += fmt.Sprintf(".%0*d", d, r.IntN(pow10(d)))
		}
		switch r.IntN(4) {
		case 1:
			s += fmt.Sprintf("%c%02d", "+-"[r.IntN(2)], r.IntN(16))
		case 2:
			s += fmt.Sprintf("%c%02d:%02d", "+-"[r.IntN(2)], r.IntN(16), r.IntN(60))
		case 3:
			s += fmt.Sprintf("%c%02d:%02d:%02d", "+-"[r.IntN(2)], r.IntN(16), r.IntN(60), r.IntN(60))
		}
		in = append(in, s)
	}
	return in
}

func pow10(n int) int {
	p := 1
	for range n {
		p *= 10
	}
	return p
}

// tzChild marks the child processes of TestParseTimestampMatchesTimeParse.
const tzChild = "RELAY_TEST_TZ_CHILD"

// TestParseTimestampMatchesTimeParse checks the fast path returns exactly
// what time.Parse with timestampLayouts returns (instant, location and
// offset), or the same failure, with time.Local at UTC, at offsets the
// inputs use and at the machine's own. Each time.Local is set by TZ in a
// child process running this test: assigning time.Local here would race
// with every goroutine reading the clock (an embedded NATS server's).
func TestParseTimestampMatchesTimeParse(t *testing.T) {
	if os.Getenv(tzChild) != "" {
		for _, s := range timestampInputs() {
			got, err := parseTimestamp(s)
			want, werr := parseWithLayouts(s)
			if (err != nil) != (werr != nil) {
				t.Fatalf("Local %s: %q: error %v, time.Parse's %v", time.Local, s, err, werr)
			}
			if !sameTime(got, want) {
				t.Fatalf("Local %s: %q parsed as %s (%s), time.Parse gives %s (%s)", time.Local, s, got, got.Location(), want, want.Location())
			}
		}
		return
	}
	for _, tz := range []string{"UTC", "Etc/GMT-2", "Etc/GMT+7", ""} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestParseTimestampMatchesTimeParse$", "-test.count=1")
		cmd.Env = append(os.Environ(), tzChild+"=1")
		if tz != "" {
			cmd.Env = append(cmd.Env, "TZ="+tz)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("TZ=%q: %v\n%s", tz, err, out)
		}
	}
}

// sameTime reports whether a and b are the same instant in the same
// location (the same *Location, or fixed zones of one name and offset).
func sameTime(a, b time.Time) bool {
	an, ao := a.Zone()
	bn, bo := b.Zone()
	same := a.Location() == b.Location() || (a.Location().String() == b.Location().String() &&
		a.Location() != time.Local && b.Location() != time.Local && a.Location() != time.UTC && b.Location() != time.UTC)
	return a.Equal(b) && same && an == bn && ao == bo && a.Format(time.RFC3339Nano) == b.Format(time.RFC3339Nano)
}

// TestParseTimestampOffsets pins the instant of offset forms.
func TestParseTimestampOffsets(t *testing.T) {
	want := time.Date(2026, 12, 1, 9, 50, 42, 123456000, time.UTC)
	for _, s := range []string{"2026-12-01 09:50:42.123456+00", "2026-12-01 11:50:42.123456+02",
		"2026-12-01 04:20:42.123456-05:30", "2026-12-01 09:51:43.123456+00:01:01", "2026-12-01 09:50:42.123456"} {
		got, ok := parseISOTimestamp(s)
		if !ok || !got.Equal(want) {
			t.Errorf("%q: %s %v, want %s", s, got, ok, want)
		}
	}
}

func BenchmarkParseTimestamp(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseTimestamp("2026-12-01 09:50:42.123456+00"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseTimestampLayouts(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseWithLayouts("2026-12-01 09:50:42.123456+00"); err != nil {
			b.Fatal(err)
		}
	}
}

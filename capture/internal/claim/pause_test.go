package claim

import (
	"fmt"
	"testing"
	"time"
)

// TestPause: while rows keep coming the poller looks again within a
// millisecond (a row is claimable one poll after the writers open when its
// seq was read have ended, so the poll cadence is most of poll mode's
// latency); while open writers hold rows back it backs off to
// blockedInterval, so a long transaction does not turn into a claim every
// millisecond; an idle outbox backs off to Options.Interval.
func TestPause(t *testing.T) {
	s := &Source{opts: Options{Interval: 200 * time.Millisecond}}
	for _, c := range []struct {
		quiet   int
		blocked bool
		want    time.Duration
	}{
		{0, false, time.Millisecond},
		{0, true, time.Millisecond},
		{1, false, 2 * time.Millisecond},
		{3, false, 8 * time.Millisecond},
		{2, true, 4 * time.Millisecond},
		{5, true, 10 * time.Millisecond},
		{40, true, 10 * time.Millisecond},
		{8, false, 200 * time.Millisecond},
		{40, false, 200 * time.Millisecond},
	} {
		s.quiet, s.blocked = c.quiet, c.blocked
		if got := s.pause(); got != c.want {
			t.Errorf("pause after %d empty claims (blocked %v) = %s, want %s", c.quiet, c.blocked, got, c.want)
		}
	}
}

// TestBackOffWhileHeld: an empty claim held back by open writers, in a run
// of such claims that began less than blockedInterval ago, does not
// lengthen the wait, so a row is claimed within about a millisecond of its
// writer's commit; once the run is older, the wait doubles up to
// blockedInterval as before, and without held rows up to Options.Interval.
func TestBackOffWhileHeld(t *testing.T) {
	now := time.Now()
	s := &Source{opts: Options{Interval: 200 * time.Millisecond}}
	s.marks.advance(10, []string{"3/7"})
	s.blocked = s.marks.held()
	for range 3 {
		s.backOff(now.Add(blockedInterval / 2))
	}
	if got := s.pause(); got != busyInterval {
		t.Errorf("pause after empty claims held by a writer open for %s = %s, want %s", blockedInterval/2, got, busyInterval)
	}
	for range 5 {
		s.backOff(now.Add(2 * blockedInterval))
	}
	if got := s.pause(); got != blockedInterval {
		t.Errorf("pause after empty claims held by a writer open for %s = %s, want %s", 2*blockedInterval, got, blockedInterval)
	}
	s.marks.advance(11, nil)
	s.blocked = s.marks.held()
	s.backOff(now.Add(3 * blockedInterval))
	if got := s.pause(); got != 64*busyInterval {
		t.Errorf("pause after 6 empty claims, nothing held = %s, want %s", got, 64*busyInterval)
	}
}

// TestBackOffUnderWriterChurn: short writers that keep replacing each other
// (other relays' archive transactions, inserts into partitions other relays
// own) hold back every empty claim, each time with pairs read just now;
// after blockedInterval of such claims the wait still doubles up to
// blockedInterval instead of staying at busyInterval.
func TestBackOffUnderWriterChurn(t *testing.T) {
	start := time.Now()
	s := &Source{opts: Options{Interval: 200 * time.Millisecond}}
	now := start
	for i := range 100 {
		s.marks.advance(int64(i+1), []string{fmt.Sprintf("4/%d", i)})
		s.blocked = s.marks.held()
		s.backOff(now)
		now = now.Add(s.pause())
		if now.Sub(start) > time.Second {
			break
		}
	}
	if got := s.pause(); got != blockedInterval {
		t.Errorf("pause after %s of empty claims under writer churn = %s, want %s", now.Sub(start), got, blockedInterval)
	}
}

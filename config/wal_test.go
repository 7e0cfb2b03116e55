package config

import (
	"strings"
	"testing"
	"time"
)

func TestWALPublicationTooLong(t *testing.T) {
	yaml := minimal + "  wal:\n    publication: " + strings.Repeat("p", 64) + "\n"
	_, err := parse("config.yaml", []byte(yaml), env(nil))
	want := "config.yaml:8: capture.wal.publication: must be at most 63 bytes"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("err = %v, want %s...", err, want)
	}
	if _, err := parse("config.yaml", []byte(minimal+"  wal:\n    publication: "+strings.Repeat("p", 63)+"\n"), env(nil)); err != nil {
		t.Fatalf("63 bytes: %v", err)
	}
}

func TestWALLinger(t *testing.T) {
	c, err := parse("config.yaml", []byte(minimal+"  wal:\n    linger: 4ms\n"), env(nil))
	if err != nil || c.Capture.WAL.Linger.D() != 4*time.Millisecond {
		t.Fatalf("linger %v, err %v", c.Capture.WAL.Linger, err)
	}
	_, err = parse("config.yaml", []byte(minimal+"  wal:\n    linger: 101ms\n"), env(nil))
	want := "config.yaml:8: capture.wal.linger: must be at most 100ms"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("err = %v, want %s...", err, want)
	}
}

func TestPollLinger(t *testing.T) {
	c, err := parse("config.yaml", []byte(minimal+"  poll:\n    linger: 12ms\n"), env(nil))
	if err != nil || c.Capture.Poll.Linger.D() != 12*time.Millisecond {
		t.Fatalf("linger %v, err %v", c.Capture.Poll.Linger, err)
	}
	_, err = parse("config.yaml", []byte(minimal+"  poll:\n    linger: 101ms\n"), env(nil))
	want := "config.yaml:8: capture.poll.linger: must be at most 100ms"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("err = %v, want %s...", err, want)
	}
}

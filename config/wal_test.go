package config

import (
	"strings"
	"testing"
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

func TestWALSourceMessages(t *testing.T) {
	wal := strings.Replace(minimal, "mode: poll", "mode: wal", 1)
	c, err := parse("config.yaml", []byte(wal+"  wal:\n    source: messages\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Capture.WAL.Messages() || c.Capture.WAL.MessagePrefix != "outbox" {
		t.Fatalf("source %q, prefix %q: want messages, outbox", c.Capture.WAL.Source, c.Capture.WAL.MessagePrefix)
	}
	for yaml, want := range map[string]string{
		minimal + "  wal:\n    source: messages\n": "config.yaml:8: capture.wal.source: messages needs capture.mode: wal",
		wal + "  wal:\n    source: rows\n":         "config.yaml:8: capture.wal.source: must be table or messages",
	} {
		if _, err := parse("config.yaml", []byte(yaml), env(nil)); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("err = %v, want %s...", err, want)
		}
	}
}

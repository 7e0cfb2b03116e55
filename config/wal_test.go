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

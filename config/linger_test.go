package config

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestLinger: each linger setting takes a duration of at most 100ms and
// refuses a longer one, naming its key and line.
func TestLinger(t *testing.T) {
	for _, tc := range []struct {
		key  string
		line int
		yaml func(linger string) string
		got  func(*Config) time.Duration
	}{
		{"capture.wal.linger", 8, func(l string) string { return minimal + "  wal:\n    linger: " + l + "\n" },
			func(c *Config) time.Duration { return c.Capture.WAL.Linger.D() }},
		{"capture.poll.linger", 8, func(l string) string { return minimal + "  poll:\n    linger: " + l + "\n" },
			func(c *Config) time.Duration { return c.Capture.Poll.Linger.D() }},
		{"sink.kafka.linger", 9, func(l string) string { return kafkaCase("    brokers: [kafka:9092]\n    linger: " + l + "\n") },
			func(c *Config) time.Duration { return c.Sink.Kafka.Linger.D() }},
	} {
		t.Run(tc.key, func(t *testing.T) {
			c, err := parse("config.yaml", []byte(tc.yaml("12ms")), env(nil))
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.got(c); got != 12*time.Millisecond {
				t.Fatalf("linger %v, want 12ms", got)
			}
			_, err = parse("config.yaml", []byte(tc.yaml("101ms")), env(nil))
			want := fmt.Sprintf("config.yaml:%d: %s: must be at most 100ms", tc.line, tc.key)
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("err = %v, want %s...", err, want)
			}
		})
	}
}

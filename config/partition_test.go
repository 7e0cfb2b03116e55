package config

import (
	"strings"
	"testing"
)

// walMinimal is minimal with capture.mode wal; cases append top-level
// sections from line 7.
var walMinimal = strings.Replace(minimal, "mode: poll", "mode: wal", 1)

func TestArchivePartitionDefaults(t *testing.T) {
	c, err := parse("config.yaml", []byte(walMinimal+"archive:\n  mode: partition\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Archive.Partitions != 8 || c.Archive.PartitionRows != 100000 {
		t.Fatalf("partitions %d, partition_rows %d: want 8, 100000", c.Archive.Partitions, c.Archive.PartitionRows)
	}
	c, err = parse("config.yaml", []byte(walMinimal+"archive:\n  mode: partition\n  partitions: 4\n  partition_rows: 1000\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Archive.Partitions != 4 || c.Archive.PartitionRows != 1000 {
		t.Fatalf("partitions %d, partition_rows %d: want 4, 1000", c.Archive.Partitions, c.Archive.PartitionRows)
	}
	if c, err = parse("config.yaml", []byte(walMinimal), env(nil)); err != nil || c.Archive.Partitions != 0 {
		t.Fatalf("delete mode: partitions %d, err %v: want 0, nil", c.Archive.Partitions, err)
	}
}

func TestArchivePartitionErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		line       int
		key, msg   string
	}{
		{"poll", minimal + "archive:\n  mode: partition\n", 8, "archive.mode", "partition needs capture.mode: wal (poll capture marks a row published by removing it)"},
		{"messages", walMinimal + "  wal:\n    source: messages\narchive:\n  mode: partition\n", 10, "archive.mode", "partition needs an outbox table"},
		{"transactional", strings.Replace(walMinimal, "type: nats", "type: kafka\n  kafka:\n    brokers: [k:9092]\n    transactional: true", 1) + "archive:\n  mode: partition\n", 11, "archive.mode", "partition keeps published rows in the outbox"},
		{"few", walMinimal + "archive:\n  mode: partition\n  partitions: 2\n", 9, "archive.partitions", "must be between 3 and 64, got 2"},
		{"many", walMinimal + "archive:\n  mode: partition\n  partitions: 65\n", 9, "archive.partitions", "must be between 3 and 64, got 65"},
		{"small", walMinimal + "archive:\n  mode: partition\n  partition_rows: 999\n", 9, "archive.partition_rows", "must be at least 1000, got 999"},
		{"other mode", walMinimal + "archive:\n  mode: delete\n  partitions: 8\n", 9, "archive.partitions", "is only used by archive.mode partition, got archive.mode delete"},
		{"default mode", walMinimal + "archive:\n  partition_rows: 5000\n", 8, "archive.partition_rows", "is only used by archive.mode partition"},
	} {
		t.Run(tc.name, func(t *testing.T) { checkLoadError(t, tc.yaml, tc.line, tc.key, tc.msg) })
	}
}

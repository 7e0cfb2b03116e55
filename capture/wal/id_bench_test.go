package wal

import (
	"testing"

	"github.com/google/uuid"
)

func BenchmarkAppendID(b *testing.B) {
	id := []byte(testID)
	buf := make([]byte, 0, 64)
	b.Run("canonical", func(b *testing.B) {
		for b.Loop() {
			buf, _ = appendID(buf[:0], id)
		}
	})
	b.Run("parse", func(b *testing.B) {
		for b.Loop() {
			u, _ := uuid.ParseBytes(id)
			buf = appendUUID(buf[:0], u)
		}
	})
}

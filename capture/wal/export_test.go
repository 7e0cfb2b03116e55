package wal

// Streaming reports whether s runs a replication stream: its
// START_REPLICATION was answered and the stream has not ended.
func Streaming(s *Source) bool { return s.live() != nil }

package wal

// Streaming reports whether s runs a replication stream: its
// START_REPLICATION was answered and the stream has not ended.
func Streaming(s *Source) bool {
	st := s.cur.Load()
	if st == nil {
		return false
	}
	select {
	case <-st.done:
		return false
	default:
		return true
	}
}

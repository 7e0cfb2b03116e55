package wal

// Streaming reports whether s runs a replication stream: its
// START_REPLICATION was answered and the stream has not ended.
func Streaming(s *Source) bool { return s.live() != nil }

// Received returns how many rows the current stream holds in its open
// batch, received up to a commit and not handed out yet; 0 while the
// open batch does not end at a commit.
func Received(s *Source) int {
	st := s.cur.Load()
	if st == nil {
		return 0
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.atCommit {
		return 0
	}
	return st.open.rows()
}

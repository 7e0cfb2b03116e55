package poll

// Hold notes that the pipeline leaves the events of ordering key key in the
// outbox (see capture.Holder): claims skip its rows until Release.
func (s *Source) Hold(key string) { s.src.Hold(key) }

// Release ends the hold of keys (see capture.Holder): their rows are
// claimable again once no batch of an earlier epoch holding rows of theirs
// is unsettled, from the first seq, so they are claimed before any newer
// row of theirs.
func (s *Source) Release(keys []string) uint64 { return s.src.Release(keys) }

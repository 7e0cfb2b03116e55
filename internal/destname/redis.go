package destname

import "fmt"

// MaxRedisStream is the longest stream key the relay writes to, in bytes.
// Redis takes keys of up to 512 MB; the bound keeps a row's value from
// making keys that are a burden to every command naming them.
const MaxRedisStream = 1024

// RedisStreamRune reports whether the relay keeps r in a stream key
// rendered from a template value: a-z A-Z 0-9 and . _ - :. Redis keys are
// binary-safe, but other characters (spaces, control characters, the
// braces of a Redis Cluster hash tag) only confuse tools and consumers.
func RedisStreamRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' || r == ':'
}

// RedisStream fails, saying what is wrong, unless name is a stream key the
// relay writes to: 1 to MaxRedisStream bytes.
func RedisStream(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("stream name is empty")
	case len(name) > MaxRedisStream:
		return fmt.Errorf("stream name %s is %d bytes, over the relay's limit of %d", excerpt(name), len(name), MaxRedisStream)
	}
	return nil
}

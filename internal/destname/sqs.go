package destname

import (
	"fmt"
	"strings"
)

// MaxSQSQueue is SQS's limit on the length of a queue name, ".fifo"
// included.
const MaxSQSQueue = 80

// SQSQueueRune reports whether SQS allows r in a queue name, the ".fifo"
// suffix aside (a-z A-Z 0-9 - _).
func SQSQueueRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
}

// SQSQueue fails, saying which rule it breaks, unless name is a valid SQS
// queue name: 1 to MaxSQSQueue characters of a-z A-Z 0-9 - _, with the
// suffix ".fifo" for a FIFO queue.
func SQSQueue(name string) error {
	base := strings.TrimSuffix(name, ".fifo")
	switch {
	case base == "":
		return fmt.Errorf("queue name %q is empty", name)
	case len(name) > MaxSQSQueue:
		return fmt.Errorf("queue name %s is %d characters, over SQS's %d", excerpt(name), len(name), MaxSQSQueue)
	case strings.ContainsFunc(base, func(r rune) bool { return !SQSQueueRune(r) }):
		return fmt.Errorf("queue name %s has characters SQS does not allow (a-z A-Z 0-9 - _, and .fifo at the end)", excerpt(name))
	}
	return nil
}

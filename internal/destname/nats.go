package destname

import (
	"fmt"
	"strings"
	"unicode"
)

// MaxNATSSubject is the longest subject the relay publishes to, in bytes.
// A NATS server closes the connection of a client whose protocol line (the
// subject, the reply subject and the sizes) exceeds its max_control_line,
// 4096 bytes by default, and consumers receive the subject in a line of
// their own beside a reply subject of up to a few hundred bytes; the limit
// leaves room for both.
const MaxNATSSubject = 1024

// NATSSubject fails, saying which rule it breaks, unless subject is a
// subject the relay can publish to: at most MaxNATSSubject bytes, no empty
// token, no wildcard token (* or >), and no whitespace or control
// character. The error quotes at most the subject's first 64 bytes.
func NATSSubject(subject string) error {
	switch {
	case len(subject) > MaxNATSSubject:
		return fmt.Errorf("subject %s is %d bytes, over the %d the relay publishes to (a NATS server closes the connection on a protocol line over its max_control_line)", excerpt(subject), len(subject), MaxNATSSubject)
	case strings.ContainsFunc(subject, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return fmt.Errorf("subject %s has whitespace or a control character", excerpt(subject))
	}
	for tok := range strings.SplitSeq(subject, ".") {
		switch tok {
		case "":
			return fmt.Errorf("subject %s has an empty token", excerpt(subject))
		case "*", ">":
			return fmt.Errorf("subject %s has the wildcard token %s", excerpt(subject), tok)
		}
	}
	return nil
}

// excerpt quotes the first 64 bytes of name, with "…" when it is longer.
func excerpt(name string) string {
	if len(name) <= 64 {
		return fmt.Sprintf("%q", name)
	}
	return fmt.Sprintf("%q…", name[:64])
}

// Package destname holds the rules brokers set for destination names, so
// that config validation and the sinks apply the same ones. It is a leaf:
// it imports only the standard library and sink/template.
package destname

import (
	"fmt"
	"strings"

	"github.com/outboxrelay/relay/sink/template"
)

// MaxKafkaTopic is Kafka's limit on the length of a topic name.
const MaxKafkaTopic = 249

// KafkaTopicRune reports whether Kafka allows r in a topic name
// (a-z A-Z 0-9 . _ -).
func KafkaTopicRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
}

// KafkaTopic fails on a name Kafka does not accept as a topic.
func KafkaTopic(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("%q is not a valid topic name", name)
	case strings.ContainsFunc(name, notKafkaTopicRune):
		return fmt.Errorf("%q has characters Kafka does not allow in a topic name (allowed: a-z A-Z 0-9 . _ -)", name)
	case len(name) > MaxKafkaTopic:
		return fmt.Errorf("topic %q... is longer than Kafka's %d characters", name[:32], MaxKafkaTopic)
	}
	return nil
}

// KafkaTopicTemplate fails when the literal text of the topic template
// tmpl (its placeholders' values are sanitized when rendered) breaks
// Kafka's rules; a template without placeholders must be a valid topic.
func KafkaTopicTemplate(tmpl string) error {
	literal := tmpl
	for _, p := range template.Placeholders {
		literal = strings.ReplaceAll(literal, p, "")
	}
	switch {
	case len(literal) > MaxKafkaTopic:
		return fmt.Errorf("longer than Kafka's %d characters", MaxKafkaTopic)
	case literal == tmpl:
		return KafkaTopic(tmpl)
	case strings.ContainsFunc(literal, notKafkaTopicRune):
		return fmt.Errorf("%q has characters Kafka does not allow in a topic name (allowed: a-z A-Z 0-9 . _ -)", tmpl)
	}
	return nil
}

func notKafkaTopicRune(r rune) bool { return !KafkaTopicRune(r) }

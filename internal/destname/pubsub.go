package destname

import (
	"fmt"
	"strings"

	"github.com/outboxrelay/relay/sink/template"
)

// Pub/Sub's limits on the length of a topic ID.
const (
	MinPubSubTopic = 3
	MaxPubSubTopic = 255
)

// PubSubTopicRune reports whether Pub/Sub allows r in a topic ID
// (A-Z a-z 0-9 - _ . ~ + %).
func PubSubTopicRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.~+%", r)
}

// PubSubTopic fails, saying which rule it breaks, unless id is a valid
// Pub/Sub topic ID: MinPubSubTopic to MaxPubSubTopic characters of
// A-Z a-z 0-9 - _ . ~ + %, starting with a letter and not with "goog".
func PubSubTopic(id string) error {
	switch {
	case len(id) < MinPubSubTopic || len(id) > MaxPubSubTopic:
		return fmt.Errorf("topic %s is %d characters; Pub/Sub takes %d to %d", excerpt(id), len(id), MinPubSubTopic, MaxPubSubTopic)
	case !isLetter(id[0]):
		return fmt.Errorf("topic %s does not start with a letter, as Pub/Sub requires", excerpt(id))
	case strings.HasPrefix(strings.ToLower(id), "goog"):
		return fmt.Errorf("topic %s starts with \"goog\", which Pub/Sub reserves", excerpt(id))
	case strings.ContainsFunc(id, func(r rune) bool { return !PubSubTopicRune(r) }):
		return fmt.Errorf("topic %s has characters Pub/Sub does not allow (A-Z a-z 0-9 - _ . ~ + %%)", excerpt(id))
	}
	return nil
}

// PubSubTopicTemplate fails when the topic template tmpl cannot render
// valid topic IDs: it must start with a letter of its literal text (a
// placeholder's value may start with anything), not with "goog", hold
// only allowed characters outside its placeholders, and, without
// placeholders, be a valid topic ID.
func PubSubTopicTemplate(tmpl string) error {
	literal := tmpl
	for _, p := range template.Placeholders {
		literal = strings.ReplaceAll(literal, p, "")
	}
	switch {
	case literal == tmpl:
		return PubSubTopic(tmpl)
	case tmpl == "" || !isLetter(tmpl[0]):
		return fmt.Errorf("a Pub/Sub topic starts with a letter: begin the template with one, not with a placeholder")
	case strings.HasPrefix(strings.ToLower(tmpl), "goog"):
		return fmt.Errorf("Pub/Sub reserves topics starting with \"goog\"")
	case strings.ContainsFunc(literal, func(r rune) bool { return !PubSubTopicRune(r) }):
		return fmt.Errorf("the text outside placeholders has characters Pub/Sub does not allow in a topic (A-Z a-z 0-9 - _ . ~ + %%)")
	case len(literal) > MaxPubSubTopic:
		return fmt.Errorf("longer than Pub/Sub's %d characters", MaxPubSubTopic)
	}
	return nil
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

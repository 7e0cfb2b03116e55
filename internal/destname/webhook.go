package destname

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/outboxrelay/relay/sink/template"
)

// MaxWebhookURL is the longest URL the webhook sink requests, in bytes:
// common servers and proxies refuse a request line over 8 KiB.
const MaxWebhookURL = 8000

// WebhookURL fails, saying what is wrong, unless the webhook URL template
// raw (whose placeholders were already checked) is an absolute http or
// https URL with placeholders only in its path and query and no fragment.
// Its messages never repeat the URL, which may hold credentials.
func WebhookURL(raw string) error {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return errors.New("must be an absolute http or https URL")
	}
	if end := strings.IndexAny(rest, "/?#"); end >= 0 {
		rest = rest[:end]
	}
	if strings.Contains(scheme+rest, "{") {
		return errors.New("placeholders are allowed only in the path and query, not in the scheme or host")
	}
	if _, err := url.Parse(scheme + "://" + rest); err != nil {
		return errors.New("not a valid URL: the host or port is malformed")
	}
	probe := raw
	for _, p := range template.Placeholders {
		probe = strings.ReplaceAll(probe, p, "x")
	}
	u, err := url.Parse(probe)
	switch {
	case err != nil:
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return errors.New("not a valid URL: " + err.Error())
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("the scheme must be http or https, got %q", u.Scheme)
	case u.Hostname() == "":
		return errors.New("the URL has no host")
	case strings.Contains(raw, "#"):
		return errors.New("a URL fragment (#...) is never sent; remove it")
	}
	return nil
}

package config

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary files to the loader: it must never panic, and
// every problem it reports must be an *Error that says what is wrong, with
// the key or line when the problem has one in the file.
func FuzzParse(f *testing.F) {
	full, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		string(full), minimal, "", "- postgres\n", "postgres:\n  url: [unclosed\n",
		minimal + "retry:\n  <<: {max_attempts: 3}\n  max: 2s\n",
		minimal + "archive:\n  table: &t a.b\ndead_letter:\n  table: *t\n",
		minimal + "http:\n  listen: \"[::1]:9090\"\n",
		sinkCase("kafka", "  kafka:\n    brokers: [k:9092]\n    sasl: {mechanism: PLAIN, username: u, password: ${PW}}\n"),
		sinkCase("webhook", "  webhook:\n    url: https://u:p@h/{aggregate_type}?token=t\n    headers: {Authorization: x}\n"),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, env(map[string]string{"PW": "pw"}))
		if (c == nil) == (err == nil) {
			t.Fatalf("Parse returned config %v and error %v", c != nil, err)
		}
		if err == nil {
			return
		}
		errs := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		}
		for _, e := range errs {
			var ce *Error
			if !errors.As(e, &ce) || strings.TrimSpace(ce.Msg) == "" {
				t.Fatalf("not a config error with a message: %#v", e)
			}
		}
	})
}

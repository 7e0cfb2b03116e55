package event

import (
	"encoding/json"
	"reflect"
	"testing"
)

var headerCases = []string{
	`{}`, ` { } `, `{"a":"b"}`, `{"a": "b", "c": "d"}`, "{\n\t\"a\" :\r\n \"b\" }",
	`{"a":"b","a":"c"}`, `{"":""}`, `{"größe":"✓"}`, `{"a":"\u00e9"}`, `{"a":"x\ny"}`,
	`{"a":"x\"y"}`, `{"a":1}`, `{"a":null}`, `{"a":"b",}`, `{,}`, `{"a"}`, `{"a":}`,
	`{"a":"b" "c":"d"}`, `null`, `[]`, `"x"`, ``, `{`, `}`, `{"a":"b"}x`, `{"a":"b"`,
	"{\"a\":\"\xff\"}", "{\"\xc3\":\"b\"}", "{\"a\":\"tab\there\"}", `{"a":["b"]}`, `{"a":{"b":"c"}}`,
	`{"a":"b"}}`, `{{}}`, ` `, `{"a":"b","c":"d","e":"f","g":"h"}`,
}

// TestParseHeaders checks that ParseHeaders agrees with json.Unmarshal on
// result and on whether it fails.
func TestParseHeaders(t *testing.T) {
	for _, in := range headerCases {
		check(t, []byte(in))
	}
}

// TestParseHeadersFresh: objects with the same text give maps of their
// own, so a caller that changes one changes no other event's headers.
func TestParseHeadersFresh(t *testing.T) {
	in := []byte(`{"source":"relaybench"}`)
	a, _ := ParseHeaders(in)
	b, _ := ParseHeaders(in)
	a["source"], a["x"] = "changed", "y"
	c, _ := ParseHeaders(in)
	for _, h := range []map[string]string{b, c} {
		if len(h) != 1 || h["source"] != "relaybench" {
			t.Fatalf("headers %v after changing another event's", h)
		}
	}
}

func FuzzParseHeaders(f *testing.F) {
	for _, in := range headerCases {
		f.Add([]byte(in))
	}
	f.Fuzz(check)
}

func check(t *testing.T, in []byte) {
	got, err := ParseHeaders(in)
	var want map[string]string
	werr := json.Unmarshal(in, &want)
	if (err != nil) != (werr != nil) {
		t.Fatalf("%q: error %v, json.Unmarshal's %v", in, err, werr)
	}
	if werr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: %#v, json.Unmarshal gives %#v", in, got, want)
	}
}

func BenchmarkParseHeaders(b *testing.B) {
	in := []byte(`{"source": "relaybench", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}`)
	b.Run("ParseHeaders", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParseHeaders(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var h map[string]string
			if err := json.Unmarshal(in, &h); err != nil {
				b.Fatal(err)
			}
		}
	})
}

package mdcheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRepositoryDocs checks every Markdown file of the repository: no
// code fence left open, no relative link to a missing file or heading.
func TestRepositoryDocs(t *testing.T) {
	problems, err := Check(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestCheckFinds checks that Check reports an unclosed fence, a fence
// line with text after it, and broken links, and accepts good ones, links inside code and fences of four
// backticks around three.
func TestCheckFinds(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("b.md", "# Title\n\n## The `relay run` command\n\n## Dup\n\n## Dup\n")
	write("a.md", "[ok](b.md) [ok](b.md#title) [ok](b.md#the-relay-run-command) [ok](b.md#dup-1) [ok](#local)\n"+
		"## Local\n"+
		"[gone](c.md) [bad anchor](b.md#nope) `[code](x.md)` [web](https://example.com/x.md)\n"+
		"````md\n```\n[in code](y.md)\n````\n"+
		"```sql\nSELECT 1;\n``` Text after the fence\n```\n"+
		"```sh\nnever closed\n[in code](z.md)\n")
	problems, err := Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
	}
	want := []string{
		"a.md:12: code fence opened here is never closed",
		"a.md:10: a fence with text after it does not close the code block: put the text on its own line, or nest with a longer fence",
		"a.md:3: link c.md: no such file",
		"a.md:3: link b.md#nope: no heading with the anchor #nope",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

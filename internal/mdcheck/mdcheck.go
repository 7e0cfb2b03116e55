// Package mdcheck checks the repository's Markdown files as a renderer
// would read them: every code fence is closed, and every relative link
// points to a file that exists and, with a #fragment, to a heading of
// that file. make test runs it on every *.md of the repository.
package mdcheck

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// Problem is one finding: the file, relative to the root, its line and
// what is wrong.
type Problem struct {
	File string
	Line int
	Msg  string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

// Check walks root, skipping hidden directories, and checks every *.md
// file in it.
func Check(root string) ([]Problem, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c := checker{root: root, anchors: map[string]map[string]bool{}}
	var problems []Problem
	for _, f := range files {
		ps, err := c.file(f)
		if err != nil {
			return nil, err
		}
		problems = append(problems, ps...)
	}
	return problems, nil
}

// checker caches the headings' anchors of the files it has read.
type checker struct {
	root    string
	anchors map[string]map[string]bool // absolute path -> anchors
}

// doc is a Markdown file split into its lines outside code: fenced blocks
// are blank, inline code spans removed.
type doc struct {
	text     []string // the lines, code blanked
	unclosed int      // the line of a fence left open, or 0
	// suspect lists the lines inside a fenced block that look meant to
	// close it or to open another: a fence with text after it, which
	// does not close the block, so what follows renders as code.
	suspect []int
}

var fence = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})(.*)$")

// parse splits data into lines and blanks the code in them.
func parse(data []byte) doc {
	lines := strings.Split(string(data), "\n")
	var d doc
	var open string
	for i, line := range lines {
		m := fence.FindStringSubmatch(line)
		switch {
		case open == "" && m != nil && !(m[1][0] == '`' && strings.Contains(m[2], "`")):
			open, d.unclosed = m[1], i+1
			line = ""
		case open != "":
			if m != nil && m[1][0] == open[0] && len(m[1]) >= len(open) {
				if strings.TrimSpace(m[2]) == "" {
					open, d.unclosed = "", 0
				} else {
					d.suspect = append(d.suspect, i+1)
				}
			}
			line = ""
		}
		d.text = append(d.text, inlineCode.ReplaceAllString(line, ""))
	}
	return d
}

var (
	inlineCode = regexp.MustCompile("`+[^`]*`+")
	link       = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s+(\S+)`)
	heading    = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// file checks one Markdown file.
func (c *checker) file(path string) ([]Problem, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rel, _ := filepath.Rel(c.root, path)
	d := parse(data)
	var problems []Problem
	if d.unclosed > 0 {
		problems = append(problems, Problem{rel, d.unclosed, "code fence opened here is never closed"})
	}
	for _, n := range d.suspect {
		problems = append(problems, Problem{rel, n, "a fence with text after it does not close the code block: put the text on its own line, or nest with a longer fence"})
	}
	for i, line := range d.text {
		var targets []string
		for _, m := range link.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := refLink.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, t := range targets {
			if msg := c.target(path, t); msg != "" {
				problems = append(problems, Problem{rel, i + 1, msg})
			}
		}
	}
	return problems, nil
}

// target checks one link target of the file at from; it returns what is
// wrong, or "". Absolute URLs and mailto: links are not checked.
func (c *checker) target(from, t string) string {
	if strings.Contains(t, "://") || strings.HasPrefix(t, "mailto:") || strings.HasPrefix(t, "<") {
		return ""
	}
	file, frag, _ := strings.Cut(t, "#")
	path := from
	if file != "" {
		path = filepath.Join(filepath.Dir(from), filepath.FromSlash(file))
		info, err := os.Stat(path)
		if err != nil {
			return fmt.Sprintf("link %s: no such file", t)
		}
		if info.IsDir() || !strings.HasSuffix(path, ".md") {
			return ""
		}
	}
	if frag == "" {
		return ""
	}
	anchors, err := c.anchorsOf(path)
	if err != nil {
		return fmt.Sprintf("link %s: %v", t, err)
	}
	if !anchors[strings.ToLower(frag)] {
		return fmt.Sprintf("link %s: no heading with the anchor #%s", t, frag)
	}
	return ""
}

// Anchors returns the anchors of the Markdown file at path, as links to it
// may name them: its headings' as GitHub makes them, and those of <a name>
// and <a id> tags.
func Anchors(path string) (map[string]bool, error) {
	c := checker{anchors: map[string]map[string]bool{}}
	return c.anchorsOf(path)
}

// anchorsOf returns the anchors of the headings of the Markdown file at
// path, as GitHub makes them, and those of <a name> and <a id> tags.
func (c *checker) anchorsOf(path string) (map[string]bool, error) {
	if a, ok := c.anchors[path]; ok {
		return a, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	anchors := map[string]bool{}
	seen := map[string]int{}
	d := parse(data)
	raw := strings.Split(string(data), "\n")
	for i, line := range d.text {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[strings.ToLower(m[1])] = true
		}
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		// The slug is made from the heading as written, inline code
		// included.
		title := heading.FindStringSubmatch(raw[i])[1]
		slug := Slug(title)
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	c.anchors[path] = anchors
	return anchors, nil
}

var (
	linkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	tags     = regexp.MustCompile(`<[^>]+>`)
)

// Slug returns GitHub's anchor for a heading: its text without links'
// targets and HTML tags, lowercased, with every character but letters,
// digits, spaces, - and _ removed and each space turned into -.
func Slug(title string) string {
	title = linkText.ReplaceAllString(title, "$1")
	title = tags.ReplaceAllString(title, "")
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

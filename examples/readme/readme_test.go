package readme

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// normalize drops indentation and blank lines: the README shows snippets at
// the left margin, the compiled file inside functions.
func normalize(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// Every Go block in the README must appear, line for line, in this
// package's sources, which compile: the README cannot show code that does not.
func TestREADMECodeCompiles(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("snippets.go")
	if err != nil {
		t.Fatal(err)
	}
	compiled := normalize(string(src))
	blocks := goBlock.FindAllStringSubmatch(string(readme), -1)
	if len(blocks) == 0 {
		t.Fatal("no Go blocks found in README.md")
	}
	for i, b := range blocks {
		if !strings.Contains(compiled, normalize(b[1])) {
			t.Errorf("README Go block %d is not in examples/readme/snippets.go, so nothing checks it compiles:\n%s", i+1, b[1])
		}
	}
}

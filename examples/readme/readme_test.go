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

// normalize drops indentation and blank lines: the documents show snippets
// at the left margin, the compiled files inside functions.
func normalize(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkBlocks reports every Go block of doc that does not appear, line for
// line, in src, the named file that compiles it.
func checkBlocks(t *testing.T, docName string, blocks []string, srcName, src string) {
	t.Helper()
	compiled := normalize(src)
	for i, b := range blocks {
		if !strings.Contains(compiled, normalize(b)) {
			t.Errorf("%s Go block %d is not in examples/readme/%s, so nothing checks it compiles:\n%s", docName, i+1, srcName, b)
		}
	}
}

func goBlocks(doc string) []string {
	var blocks []string
	for _, m := range goBlock.FindAllStringSubmatch(doc, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// Every Go block in the README must appear, line for line, in this
// package's snippets.go, which compiles; the complete program it shows must
// be orders/main.go, byte for byte, which TestProgramRunsAsPrinted builds
// and runs against the broker.
func TestREADMECodeCompiles(t *testing.T) {
	blocks := goBlocks(read(t, filepath.Join("..", "..", "README.md")))
	if len(blocks) == 0 {
		t.Fatal("no Go blocks found in README.md")
	}
	program := read(t, filepath.Join("orders", "main.go"))
	var snippets []string
	found := false
	for _, b := range blocks {
		if strings.Contains(b, "package main") {
			found = true
			if b != program {
				t.Errorf("README's complete program differs from examples/readme/orders/main.go: copy the file into the README as it is")
			}
			continue
		}
		snippets = append(snippets, b)
	}
	if !found {
		t.Error("README.md shows no complete program (a block with package main)")
	}
	checkBlocks(t, "README.md", snippets, "snippets.go", read(t, "snippets.go"))
}

// Every Go block in docs/NAME.md must appear, line for line, in
// docs_NAME.go (dashes as underscores), which compiles.
func TestDocsCodeCompiles(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md found")
	}
	for _, path := range docs {
		blocks := goBlocks(read(t, path))
		name := strings.TrimSuffix(filepath.Base(path), ".md")
		srcName := "docs_" + strings.ReplaceAll(name, "-", "_") + ".go"
		src, err := os.ReadFile(srcName)
		switch {
		case len(blocks) == 0:
			if err == nil {
				t.Errorf("%s has no Go block left: delete examples/readme/%s", filepath.Base(path), srcName)
			}
			continue
		case err != nil:
			t.Errorf("%s has %d Go blocks and no examples/readme/%s to compile them", filepath.Base(path), len(blocks), srcName)
			continue
		}
		checkBlocks(t, "docs/"+filepath.Base(path), blocks, srcName, string(src))
	}
}

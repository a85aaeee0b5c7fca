package listener_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The two things a handler must not do cannot be enforced by the listener, so
// both the package doc and the README must say them (issue 17): settle its own
// delivery (a second ack closes the channel), and wait for another message of
// the same queue (one handler at a time per consumer).
func TestDocsSayWhatAHandlerMustNotDo(t *testing.T) {
	for _, file := range []string{"doc.go", "../README.md"} {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		// Join wrapped lines: drop comment markers, collapse whitespace.
		text := regexp.MustCompile(`(?m)^\s*//\s?`).ReplaceAllString(string(raw), "")
		text = strings.Join(strings.Fields(text), " ")
		for _, want := range []*regexp.Regexp{
			regexp.MustCompile(`must not (do: )?settle its own delivery`),
			regexp.MustCompile(`second ack[^.]*(broker closes the channel|makes the broker close the channel)`),
			regexp.MustCompile(`wait for another message of the same queue`),
			regexp.MustCompile(`one handler runs at a time per consumer`),
		} {
			if !want.MatchString(text) {
				t.Errorf("%s does not say what a handler must not do: no match for %q", file, want)
			}
		}
	}
}

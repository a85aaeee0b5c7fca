package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/escape"
)

// Whatever a dead letter holds was written by its sender, who may be hostile:
// every piece of message-derived text the CLI prints goes through escapeLine
// or escapeBlock (package escape, which the console shares), so that control
// characters, bidi overrides and bytes that are not UTF-8 show as \x1b,
// \u202e, \xff and never reach the terminal.
var (
	// escapeLine renders s for one line, a table cell or a "name: value"
	// line: line breaks are escaped too.
	escapeLine = escape.Line
	// escapeBlock renders s for a multi-line field (a body, a stack trace):
	// its \n line breaks stay.
	escapeBlock = escape.Block
	// headerValue renders a header value on one line, every string in it
	// escaped.
	headerValue = escape.HeaderValue
)

// writeHeader writes one "  name: value" line of show. A string value keeps
// its line breaks (stack traces, errors.Join messages), with its further
// lines indented deeper than any header, so no line of a value passes for a
// header of its own.
func writeHeader(w io.Writer, name string, v any) {
	value := headerValue(v)
	if s, ok := v.(string); ok {
		value = strings.ReplaceAll(escapeBlock(s), "\n", "\n    ")
	}
	fmt.Fprintf(w, "  %s: %s\n", escapeLine(name), value)
}

// writeBody writes show's body: text as text, escaped, its line breaks kept;
// a binary body (escape.IsBinary) as a hex dump of its first
// escape.MaxHexDump bytes.
func writeBody(w io.Writer, contentType string, body []byte) {
	if !escape.IsBinary(body) {
		fmt.Fprintf(w, "body (%d bytes):\n%s\n", len(body), escapeBlock(string(body)))
		return
	}
	fmt.Fprintf(w, "body (%d bytes, binary, content type %s):\n", len(body), orDash(escapeLine(contentType)))
	dump, notShown := escape.HexDump(body)
	io.WriteString(w, dump)
	if notShown > 0 {
		fmt.Fprintf(w, "… %d more bytes not shown (the first %d are)\n", notShown, len(body)-notShown)
	}
}

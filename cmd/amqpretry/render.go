package main

import (
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Whatever a dead letter holds was written by its sender, who may be hostile:
// terminal escape sequences (ESC [ ..., an OSC 52 clipboard write), a \r that
// overwrites the line, bidi overrides (U+202E) that reorder what the operator
// reads. Every piece of message-derived text the CLI prints goes through
// escapeLine or escapeBlock, which show such characters in Go's notation
// (\x1b, \r, \u202e, \xff for a byte that is not UTF-8) so the operator sees
// what is there, and leave printable text, non-ASCII letters included, as it
// is. A backslash is left as it is: doubling it would garble every JSON body
// and Windows path to rule out a look-alike that can do no harm.

// escapeLine renders s for one line, a table cell or a "name: value" line:
// line breaks are escaped too.
func escapeLine(s string) string { return escape(s, false) }

// escapeBlock renders s for a multi-line field (a body, a stack trace): its
// \n line breaks stay, everything else escapeLine escapes is escaped, \r and
// \t included.
func escapeBlock(s string) string { return escape(s, true) }

func escape(s string, keepNewlines bool) string {
	if isShownAsIs(s, keepNewlines) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case shownAsIs(r, keepNewlines):
			b.WriteString(s[i : i+n])
		default:
			// strconv's printability test is Unicode's: C0, DEL, C1, format
			// characters (bidi controls, zero-width joiners), separators other
			// than the space, private and unassigned code points.
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// shownAsIs is true for a printable rune (the space is the only separator
// strconv counts printable) and, in a block, for the line break.
func shownAsIs(r rune, keepNewlines bool) bool {
	return strconv.IsPrint(r) || (keepNewlines && r == '\n')
}

func isShownAsIs(s string, keepNewlines bool) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || !shownAsIs(r, keepNewlines) {
			return false
		}
		i += n
	}
	return true
}

// headerValue renders a header value on one line, in the shape fmt's %v gives
// it (map[k:v], [a b]), with every string in it, nested ones and table keys
// included, escaped.
func headerValue(v any) string {
	var b strings.Builder
	writeValue(&b, v)
	return b.String()
}

func writeValue(b *strings.Builder, v any) {
	switch v := v.(type) {
	case string:
		b.WriteString(escapeLine(v))
	case amqp.Table:
		b.WriteString("map[")
		for i, k := range slices.Sorted(maps.Keys(v)) {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(escapeLine(k))
			b.WriteByte(':')
			writeValue(b, v[k])
		}
		b.WriteByte(']')
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(' ')
			}
			writeValue(b, e)
		}
		b.WriteByte(']')
	default:
		// Numbers, times, decimals, byte arrays (as numbers): nothing a sender
		// controls reaches the terminal through them, but a type we did not
		// foresee could carry text.
		b.WriteString(escapeLine(fmt.Sprint(v)))
	}
}

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

// maxHexDump bounds the part of a binary body show dumps: 64 lines.
const maxHexDump = 1024

// writeBody writes show's body: text as text, escaped, its line breaks kept;
// a binary body (not UTF-8, or a quarter or more of it unprintable) as a hex
// dump of its first maxHexDump bytes, since escaping it would print a wall of
// \x sequences nobody can read.
func writeBody(w io.Writer, contentType string, body []byte) {
	if !isBinary(body) {
		fmt.Fprintf(w, "body (%d bytes):\n%s\n", len(body), escapeBlock(string(body)))
		return
	}
	fmt.Fprintf(w, "body (%d bytes, binary, content type %s):\n", len(body), orDash(escapeLine(contentType)))
	shown := body[:min(len(body), maxHexDump)]
	io.WriteString(w, hex.Dump(shown)) // its text column prints only bytes 0x20-0x7e
	if cut := len(body) - len(shown); cut > 0 {
		fmt.Fprintf(w, "… %d more bytes not shown (the first %d are)\n", cut, len(shown))
	}
}

func isBinary(body []byte) bool {
	if !utf8.Valid(body) {
		return true
	}
	runes, unprintable := 0, 0
	for _, r := range string(body) {
		runes++
		if !strconv.IsPrint(r) && r != '\n' && r != '\r' && r != '\t' {
			unprintable++
		}
	}
	return unprintable*4 >= runes && unprintable > 0
}

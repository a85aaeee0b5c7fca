// Package escape renders text a message's sender wrote, which may be hostile,
// so that it shows what is there and does nothing: the CLI prints it to a
// terminal, the console puts it in a page (after html/template's own
// escaping), and both go through Line and Block.
//
// A dead letter may carry terminal escape sequences (ESC [ ..., an OSC 52
// clipboard write), a \r that overwrites the line, bidi overrides (U+202E)
// that reorder what the operator reads. Line and Block show such characters
// in Go's notation (\x1b, \r, \u202e, \xff for a byte that is not UTF-8) and
// leave printable text, non-ASCII letters included, as it is. A backslash is
// left as it is: doubling it would garble every JSON body and Windows path to
// rule out a look-alike that can do no harm.
package escape

import (
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Line renders s for one line, a table cell or a "name: value" line: line
// breaks are escaped too.
func Line(s string) string { return escape(s, false) }

// Block renders s for a multi-line field (a body, a stack trace): its \n line
// breaks stay, everything else Line escapes is escaped, \r and \t included.
func Block(s string) string { return escape(s, true) }

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

// HeaderValue renders a header value on one line, in the shape fmt's %v gives
// it (map[k:v], [a b]), with every string in it, nested ones and table keys
// included, escaped.
func HeaderValue(v any) string {
	var b strings.Builder
	writeValue(&b, v)
	return b.String()
}

func writeValue(b *strings.Builder, v any) {
	switch v := v.(type) {
	case string:
		b.WriteString(Line(v))
	case amqp.Table:
		b.WriteString("map[")
		for i, k := range slices.Sorted(maps.Keys(v)) {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(Line(k))
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
		b.WriteString(Line(fmt.Sprint(v)))
	}
}

// MaxHexDump bounds the part of a binary body that is dumped: 64 lines.
const MaxHexDump = 1024

// HexDump is a hex dump of body's first MaxHexDump bytes, whose text column
// prints only bytes 0x20-0x7e, and how many bytes it left out.
func HexDump(body []byte) (dump string, notShown int) {
	shown := body[:min(len(body), MaxHexDump)]
	return hex.Dump(shown), len(body) - len(shown)
}

// IsBinary reports whether a body is better shown as a hex dump than as
// escaped text: it is not UTF-8, or a quarter or more of it is unprintable
// (escaping it would print a wall of \x sequences nobody can read).
func IsBinary(body []byte) bool {
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

package recoverer

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/amqpretry/amqpretry/internal/amqptable"
	"github.com/amqpretry/amqpretry/internal/errtext"
	"github.com/amqpretry/amqpretry/internal/errtree"
	"github.com/amqpretry/amqpretry/middleware"
)

// StackTrace renders what Spring puts in x-exception-stacktrace: for a panic,
// its value and stack; otherwise the chain of wrapped errors, one per line
// with its Go type, outermost first, since a Go error has no stack.
func StackTrace(err error) string {
	if pe, ok := errtree.As[*middleware.PanicError](err); ok {
		return panicTrace(pe)
	}
	var b strings.Builder
	b.Grow(256) // a chain of a few errors, in one allocation
	w := chainWriter{b: &b}
	w.write(err, 0)
	return b.String()
}

// stackTraceBox is StackTrace(err), boxed for a header table: a chain that
// renders as the last one did (a flood of one failure) reuses its string and
// box, rendered meanwhile into a pooled buffer.
func stackTraceBox(err error, last *internedString) any {
	if pe, ok := errtree.As[*middleware.PanicError](err); ok {
		return last.box(panicTrace(pe))
	}
	buf := chainBufs.Get().(*bytes.Buffer)
	buf.Reset()
	w := chainWriter{b: buf}
	w.write(err, 0)
	v := last.boxBytes(buf.Bytes())
	if buf.Cap() <= 64<<10 { // a huge chain's buffer is not worth keeping
		chainBufs.Put(buf)
	}
	return v
}

// panicTrace is a panic's stack trace header. The value is
// x-exception-message's too: here it is cut short, so that a huge one leaves
// room for the frames.
func panicTrace(pe *middleware.PanicError) string {
	return fmt.Sprintf("panic: %s\n\n%s", cut(fmt.Sprint(pe.Value), maxPanicValue), pe.Stack)
}

var chainBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Bounds on the rendering of an error chain: errors.Join trees can fan out
// exponentially, and x-exception-message already carries the whole message.
const (
	maxChainDepth = 32
	maxChainNodes = 64
	maxChainLine  = 1000
	// maxPanicValue bounds a panic's value in its stack trace.
	maxPanicValue = 4096
)

type chainWriter struct {
	b interface {
		io.Writer
		io.StringWriter
		io.ByteWriter
	}
	nodes int
}

func (w *chainWriter) write(err error, depth int) {
	if err == nil || depth >= maxChainDepth {
		return
	}
	if w.nodes++; w.nodes > maxChainNodes {
		if w.nodes == maxChainNodes+1 {
			fmt.Fprintf(w.b, "%s… (more wrapped errors omitted)\n", strings.Repeat("  ", depth))
		}
		return
	}
	line := ErrorString(err)
	if len(line) > maxChainLine {
		line = cut(line, maxChainLine)
	}
	line = strings.ReplaceAll(line, "\n", " | ") // one line per error (errors.Join uses newlines)
	for range depth {
		w.b.WriteString("  ")
	}
	w.b.WriteString(errtree.TypeName(err))
	w.b.WriteString(": ")
	w.b.WriteString(line)
	w.b.WriteByte('\n')
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			w.write(e, depth+1)
		}
	case interface{ Unwrap() error }:
		w.write(u.Unwrap(), depth+1)
	}
}

// ErrorString is err.Error(), made valid UTF-8, and safe from an Error method
// that panics, for a Recoverer of your own that writes the error somewhere.
func ErrorString(err error) string { return errtext.String(err) }

// fitFaultText makes the exception message and stack trace fit in room bytes
// of header table, their own keys and type tags included: it cuts the stack
// trace first, down to half the room, then the message; a cut text ends in
// a marker saying how much was cut. Both come back valid UTF-8. It fails
// only when room cannot hold even the two empty headers.
func fitFaultText(room int, message, stack string, withStack bool) (string, string, error) {
	message, stack = validUTF8(message), validUTF8(stack)
	room -= entrySize(HeaderExceptionMessage)
	if withStack {
		room -= entrySize(HeaderExceptionStacktrace)
	} else {
		stack = ""
	}
	if room < 0 {
		return "", "", fmt.Errorf("recoverer: the message's headers leave no room for the fault headers within frame_max minus the headroom: lower WithHeadroom or trim the headers")
	}
	if len(message)+len(stack) <= room {
		return message, stack, nil
	}
	// The stack gives way first, but keeps at least half the room (or all
	// it needs), so that a huge message does not leave it empty: a cut
	// text always has room for its marker when the room holds two.
	stack = cut(stack, max(room-len(message), min(len(stack), room/2)))
	message = cut(message, room-len(stack))
	return message, stack, nil
}

// validUTF8 is s with invalid UTF-8 replaced; utf8.ValidString checks the
// common case, all valid, several times faster than ToValidUTF8 does.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// entrySize is the encoded size of a string header with this key, value
// excluded.
func entrySize(key string) int { return 1 + len(key) + amqptable.FieldSize("") }

// cut shortens s to at most n bytes, on a rune boundary, ending with a marker
// that says how much was cut; "" when not even the marker fits.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	longest := marker(len(s), len(s)) // the marker is never longer than this
	keep := n - len(longest)
	if keep < 0 {
		return ""
	}
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + marker(len(s)-keep, len(s))
}

func marker(cutBytes, total int) string {
	return fmt.Sprintf(" …[cut %d of %d bytes]", cutBytes, total)
}

package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// terminalUnsafe returns the first byte offset in out, and a description, of
// what must not reach a terminal: a byte that is not UTF-8, or a rune
// strconv does not count printable (C0, DEL, C1, bidi and other format
// characters), but for \n where newlines are allowed. -1 means none.
func terminalUnsafe(out string, newlines bool) (int, string) {
	for i, r := range out {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(out[i:], "\uFFFD"):
			return i, "a byte that is not UTF-8"
		case r == '\n' && newlines:
		case !strconv.IsPrint(r):
			return i, strconv.QuoteRune(r)
		}
	}
	return -1, ""
}

func TestEscape(t *testing.T) {
	tests := []struct {
		name, in    string
		line, block string // "" in block: the same as line
	}{
		{"ASCII", `order 7: {"id":"a-1"}`, `order 7: {"id":"a-1"}`, ""},
		{"letters of any script", "Grüße, 错误, Ωμέγα, שלום", "Grüße, 错误, Ωμέγα, שלום", ""},
		{"a valid U+FFFD", "bad \uFFFD char", "bad \uFFFD char", ""},
		{"backslashes as they are", `C:\temp\x1b`, `C:\temp\x1b`, ""},
		{"CSI colour", "\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`, ""},
		{"OSC 52 clipboard write", "\x1b]52;c;cm0gLXJmIH4=\a", `\x1b]52;c;cm0gLXJmIH4=\a`, ""},
		{"carriage return overwriting", "ok\rFORGED", `ok\rFORGED`, ""},
		{"CRLF", "a\r\nb", `a\r\nb`, "a\\r\nb"},
		{"newline", "a\nb", `a\nb`, "a\nb"},
		{"tab and other C0", "\t\x00\b\f\v\x01\x1f", `\t\x00\b\f\v\x01\x1f`, ""},
		{"DEL", "a\x7fb", `a\x7fb`, ""},
		{"C1 CSI as a rune", "\u009b31m", `\u009b31m`, ""},
		{"NEL", "a\u0085b", `a\u0085b`, ""},
		{"C1 byte alone, not UTF-8", "\x9b31m", `\x9b31m`, ""},
		{"invalid UTF-8", "a\xff\xfeb\xc3", `a\xff\xfeb\xc3`, ""},
		{"bidi override", "txt.\u202eexe", `txt.\u202eexe`, ""},
		{"bidi isolates and marks", "\u2066\u2069\u200e\u200f\u061c", `\u2066\u2069\u200e\u200f\u061c`, ""},
		{"zero-width and line separators", "a\u200bb\u2028c\u2029", `a\u200bb\u2028c\u2029`, ""},
		{"tag characters", "\U000e0041", `\U000e0041`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := escapeLine(tt.in); got != tt.line {
				t.Errorf("escapeLine(%q) = %q, want %q", tt.in, got, tt.line)
			}
			want := tt.block
			if want == "" {
				want = tt.line
			}
			if got := escapeBlock(tt.in); got != want {
				t.Errorf("escapeBlock(%q) = %q, want %q", tt.in, got, want)
			}
		})
	}
}

func TestHeaderValue(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"string", "tax service\ntimed out\x1b[2J", `tax service\ntimed out\x1b[2J`},
		{"number", int64(3), "3"},
		{"time", at, "2026-01-02 03:04:05 +0000 UTC"},
		{"bytes", []byte("\x1b"), "[27]"},
		{"nil", nil, "<nil>"},
		{"x-death, as fmt shows it", []any{amqp.Table{"count": int64(1), "queue": "orders", "routing-keys": []any{"orders.new"}}},
			"[map[count:1 queue:orders routing-keys:[orders.new]]]"},
		{"hostile keys and values at any depth", amqp.Table{"k\x1b]52;c;x\a": []any{"\u202e", amqp.Table{"\r": []any{"\x9b"}}}},
			`map[k\x1b]52;c;x\a:[\u202e map[\r:[\x9b]]]]`},
	}
	for _, tt := range tests {
		if got := headerValue(tt.v); got != tt.want {
			t.Errorf("%s: headerValue = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestOneLine(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"", 10, "-"},
		{"tax service\ntimed  out", 60, "tax service timed out"},
		{"a\x1b[2Jb", 60, `a\x1b[2Jb`},
		{"abcdefghij", 5, "abcd…"},
		{"错误错误错误", 3, "错误…"},
		// Cut before escaping: the escape stays whole and the byte that is
		// not UTF-8 stays visible as what it is.
		{"ab\x1bcdef", 4, `ab\x1b…`},
		{"ab\xffcdef", 4, `ab\xff…`},
	}
	for _, tt := range tests {
		if got := oneLine(tt.in, tt.n); got != tt.want {
			t.Errorf("oneLine(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

func TestWriteBody(t *testing.T) {
	big := bytes.Repeat([]byte{0x00, 0xff, 0x1b, 'A'}, 1000)
	tests := []struct {
		name        string
		contentType string
		body        []byte
		want        []string
		not         []string
	}{
		{"text keeps its lines", "application/json", []byte("{\n  \"a\": 1\n}"), []string{"body (12 bytes):\n{\n  \"a\": 1\n}\n"}, []string{"binary"}},
		{"text with an escape sequence stays text", "text/plain", []byte("hello \x1b[2J world, and more words"),
			[]string{`hello \x1b[2J world`}, []string{"binary"}},
		{"empty", "", nil, []string{"body (0 bytes):\n\n"}, nil},
		{"not UTF-8", "application/x-protobuf", []byte("\x08\x96\x01\xff"),
			[]string{"body (4 bytes, binary, content type application/x-protobuf):\n", "00000000  08 96 01 ff  "}, []string{"not shown"}},
		{"valid UTF-8 but mostly controls", "", []byte("\x01\x02\x03abc"), []string{"binary, content type -", "01 02 03 61 62 63"}, nil},
		{"hostile content type", "\x1b]0;title\a", []byte{0xff}, []string{`content type \x1b]0;title\a`}, nil},
		{"long binary is cut", "", big, []string{"body (4000 bytes, binary", "000003f0  ", "… 2976 more bytes not shown (the first 1024 are)\n"},
			[]string{"00000400  "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			writeBody(&b, tt.contentType, tt.body)
			out := b.String()
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(out, n) {
					t.Errorf("output has %q:\n%s", n, out)
				}
			}
			if i, what := terminalUnsafe(out, true); i >= 0 {
				t.Errorf("%s at byte %d of %q", what, i, out)
			}
		})
	}
}

// A multi-line header keeps its lines, indented deeper than any header, so a
// line of its value cannot pass for another header.
func TestWriteMessageIndentsMultiLineHeaders(t *testing.T) {
	var b strings.Builder
	writeMessage(&b, &amqp.Delivery{MessageId: "m", Headers: amqp.Table{
		"x-exception-stacktrace": "panic: boom\n\ngoroutine 1 [running]:\n\tmain.go:7\r",
		"x-exception-message":    "ok\n  x-original-exchange: forged",
	}}, "x-amqpretry-")
	for _, want := range []string{
		"  x-exception-message: ok\n      x-original-exchange: forged\n",
		"  x-exception-stacktrace: panic: boom\n    \n    goroutine 1 [running]:\n    \\tmain.go:7\\r\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
}

// FuzzEscape: whatever a message holds, what the CLI prints of it is valid
// UTF-8 without a C0 or C1 control, DEL or format character, but for the
// newlines of a block; a block keeps every line break, and printable text
// is printed as it is.
func FuzzEscape(f *testing.F) {
	for _, s := range []string{"", "plain", "Grüße 错误", "\x1b[31m\r\n\a\u009b\u202e\xff\t", "a\x1b]52;c;eA==\x07b", "\xc3", "\U000e0041\u2028"} {
		f.Add(s, []byte(s))
	}
	f.Fuzz(func(t *testing.T, s string, body []byte) {
		line, block := escapeLine(s), escapeBlock(s)
		if i, what := terminalUnsafe(line, false); i >= 0 {
			t.Fatalf("escapeLine(%q) = %q: %s at byte %d", s, line, what, i)
		}
		if i, what := terminalUnsafe(block, true); i >= 0 {
			t.Fatalf("escapeBlock(%q) = %q: %s at byte %d", s, block, what, i)
		}
		if got, want := strings.Count(block, "\n"), strings.Count(s, "\n"); got != want {
			t.Fatalf("escapeBlock(%q) = %q: %d line breaks, want %d", s, block, got, want)
		}
		if printable := strings.IndexFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) < 0 && utf8.ValidString(s); printable && line != s {
			t.Fatalf("escapeLine(%q) = %q: printable text must stay as it is", s, line)
		}
		if cell := oneLine(s, 60); strings.Contains(cell, "\n") || utf8.RuneCountInString(cell) > 60*len(`\U0010ffff`) {
			t.Fatalf("oneLine(%q) = %q", s, cell)
		} else if i, what := terminalUnsafe(cell, false); i >= 0 {
			t.Fatalf("oneLine(%q) = %q: %s at byte %d", s, cell, what, i)
		}
		var out strings.Builder
		writeMessage(&out, &amqp.Delivery{
			MessageId: s, RoutingKey: s, Exchange: s, ContentType: s,
			Headers: amqp.Table{s: s, "nested": amqp.Table{s: []any{s, body, int64(len(s))}}, "x-amqpretry-failed-at": s},
			Body:    body,
		}, "x-amqpretry-")
		if i, what := terminalUnsafe(out.String(), true); i >= 0 {
			t.Fatalf("writeMessage: %s at byte %d of %q", what, i, out.String())
		}
		var js bytes.Buffer
		if err := writeJSON(&js, deadLetterJSON{MessageID: s, Exception: s}); err != nil {
			t.Fatal(err)
		}
		if i, what := terminalUnsafe(js.String(), true); i >= 0 {
			t.Fatalf("writeJSON: %s at byte %d of %q", what, i, js.String())
		}
		var back deadLetterJSON
		if err := json.Unmarshal(js.Bytes(), &back); err != nil || (utf8.ValidString(s) && back.MessageID != s) {
			t.Fatalf("writeJSON of %q gave %s, which decodes to %q (%v)", s, js.String(), back.MessageID, err)
		}
	})
}

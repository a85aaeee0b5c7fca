package recoverer

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

func TestFitFaultText(t *testing.T) {
	overhead := entrySize(HeaderExceptionMessage) + entrySize(HeaderExceptionStacktrace)
	long := strings.Repeat("é", 1000) // 2000 bytes
	tests := []struct {
		name             string
		room             int
		message, stack   string
		wantMsg, wantStk string
	}{
		{"fits", overhead + 10, "boom", "st", "boom", "st"},
		{"stack cut first", overhead + 100, "boom", long, "boom", cut(long, 96)},
		{"then the message, the stack keeping half", overhead + 100, long, long, cut(long, 50), cut(long, 50)},
		{"a short stack kept whole", overhead + 100, long, "st", cut(long, 98), "st"},
		{"exactly full", overhead + 6, "boom", "st", "boom", "st"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, stk, err := fitFaultText(tt.room, tt.message, tt.stack, true)
			if err != nil {
				t.Fatal(err)
			}
			if msg != tt.wantMsg || stk != tt.wantStk {
				t.Errorf("got (%q, %q), want (%q, %q)", msg, stk, tt.wantMsg, tt.wantStk)
			}
		})
	}
	if _, _, err := fitFaultText(overhead-1, "", "", true); err == nil {
		t.Error("no room at all must be an error")
	}
}

func TestCut(t *testing.T) {
	s := strings.Repeat("日本", 100) // 3-byte runes
	got := cut(s, 100)
	if len(got) > 100 || !utf8.ValidString(got) || !strings.Contains(got, "…[cut ") {
		t.Fatalf("cut = %q (%d bytes)", got, len(got))
	}
	if cut("short", 100) != "short" {
		t.Error("a string that fits must not change")
	}
	if cut(s, 5) != "" {
		t.Error("when not even the marker fits, cut returns nothing")
	}
}

// FuzzFitFaultText: whatever the texts and room, the result fits, is valid
// UTF-8, and is unchanged when it already fitted.
func FuzzFitFaultText(f *testing.F) {
	f.Add(200, "boom", "stack", true)
	f.Add(60, strings.Repeat("é", 300), strings.Repeat("x", 500), true)
	f.Add(80, "\xff\xfe invalid", "\xc3", false)
	f.Fuzz(func(t *testing.T, room int, message, stack string, withStack bool) {
		msg, stk, err := fitFaultText(room, message, stack, withStack)
		overhead := entrySize(HeaderExceptionMessage)
		if withStack {
			overhead += entrySize(HeaderExceptionStacktrace)
		}
		if err != nil {
			if room >= overhead {
				t.Fatalf("room %d ≥ overhead %d, yet: %v", room, overhead, err)
			}
			return
		}
		if len(msg)+len(stk) > room-overhead {
			t.Fatalf("%d+%d bytes exceed the room %d", len(msg), len(stk), room-overhead)
		}
		if !utf8.ValidString(msg) || !utf8.ValidString(stk) {
			t.Fatalf("invalid UTF-8: %q %q", msg, stk)
		}
		if !withStack && stk != "" {
			t.Fatal("a stack without WithStackTrace")
		}
		vm, vs := strings.ToValidUTF8(message, "\uFFFD"), strings.ToValidUTF8(stack, "\uFFFD")
		if !withStack {
			vs = ""
		}
		if len(vm)+len(vs) <= room-overhead && (msg != vm || stk != vs) {
			t.Fatal("texts that fitted were changed")
		}
	})
}

type panickyError struct{}

func (panickyError) Error() string { panic("Error() is broken") }

func TestErrorDescriptions(t *testing.T) {
	wrapped := fmt.Errorf("handle order 7: %w", errors.New("db down"))
	exhausted := &middleware.RetriesExhaustedError{Attempts: 5, Last: middleware.Permanent(wrapped)}
	if got := chainrun.HandlerError(exhausted); got != wrapped {
		t.Errorf("HandlerError = %v, want the handler's own error", got)
	}
	if got := chainrun.ErrorType(exhausted); got != `errors.New("db down")` { // the wrapped cause, not fmt's wrapper
		t.Errorf("ErrorType = %q", got)
	}
	if got := chainrun.ErrorType(&middleware.PanicError{Value: "x"}); got != "panic" {
		t.Errorf("ErrorType of a panic = %q", got)
	}
	chain := StackTrace(wrapped)
	if chain != "*fmt.wrapError: handle order 7: db down\n  *errors.errorString: db down\n" {
		t.Errorf("StackTrace = %q", chain)
	}
	panicStack := StackTrace(&middleware.PanicError{Value: "boom", Stack: []byte("goroutine 1 [running]:")})
	if !strings.HasPrefix(panicStack, "panic: boom\n\ngoroutine 1") {
		t.Errorf("StackTrace of a panic = %q", panicStack)
	}
	if got := ErrorString(panickyError{}); !strings.Contains(got, "panicked") {
		t.Errorf("ErrorString of a panicking Error() = %q", got)
	}
	if got := ErrorString(errors.New("bad \xff byte")); !utf8.ValidString(got) {
		t.Errorf("ErrorString kept invalid UTF-8: %q", got)
	}
}

func TestStackTraceOfAnExplodingJoinIsBounded(t *testing.T) {
	err := errors.New("leaf")
	for range 12 { // 2^12 leaves
		err = errors.Join(err, err)
	}
	st := StackTrace(err)
	if n := strings.Count(st, "\n"); n > maxChainNodes+1 || !strings.Contains(st, "more wrapped errors omitted") {
		t.Fatalf("%d lines: the chain must be cut at %d nodes", n, maxChainNodes)
	}
}

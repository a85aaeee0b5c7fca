package chainrun_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"syscall"
	"testing"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// dbError stands for a driver's error (*pgconn.PgError).
type dbError struct{ Code string }

func (e *dbError) Error() string { return "db: " + e.Code }

// commitError stands for a wrapper that adds context (inbox.CommitError).
type commitError struct{ Err error }

func (e *commitError) Error() string { return "commit failed: " + e.Err.Error() }
func (e *commitError) Unwrap() error { return e.Err }

// The rule for error.type and x-amqpretry-error-type: the innermost error,
// through every wrapper, so that failures group by cause; a wrapped
// errors.New sentinel by its value.
func TestErrorTypeNamesTheInnermostError(t *testing.T) {
	syntax := &json.SyntaxError{Offset: 3}
	outOfStock := errors.New("inventory: out of stock")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"errors.New as it is", errors.New("order 42 is invalid"), "*errors.errorString"},
		{"a type of its own", syntax, "*json.SyntaxError"},
		{"fmt.Errorf %w", fmt.Errorf("decode order: %w", syntax), "*json.SyntaxError"},
		{"two %w: the first", fmt.Errorf("decode: %w (and %w)", syntax, outOfStock), "*json.SyntaxError"},
		{"errors.Join: the first", errors.Join(fmt.Errorf("a: %w", &dbError{"23505"}), syntax), "*chainrun_test.dbError"},
		{"Permanent", middleware.Permanent(fmt.Errorf("bad body: %w", syntax)), "*json.SyntaxError"},
		{"a wrapper of the handler's own", &commitError{Err: &dbError{"40001"}}, "*chainrun_test.dbError"},
		{"retries exhausted", &middleware.RetriesExhaustedError{Attempts: 3, Last: fmt.Errorf("save: %w", &commitError{&dbError{"57P01"}})}, "*chainrun_test.dbError"},
		{"a wrapped sentinel", fmt.Errorf("reserve: %w", outOfStock), `errors.New("inventory: out of stock")`},
		{"a well-known sentinel", fmt.Errorf("read body: %w", io.ErrUnexpectedEOF), "io.ErrUnexpectedEOF"},
		{"a network error", &url.Error{Op: "Post", URL: "http://payments", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}, "syscall.Errno"},
		{"a panic", &middleware.PanicError{Value: "boom"}, "panic"},
		{"a long sentinel is cut", fmt.Errorf("x: %w", errors.New(string(make([]byte, 100)))), fmt.Sprintf("errors.New(%q)", string(make([]byte, 64))+"…")},
	}
	for _, tt := range tests {
		if got := chainrun.ErrorType(tt.err); got != tt.want {
			t.Errorf("%s: ErrorType = %q, want %q", tt.name, got, tt.want)
		}
	}
}

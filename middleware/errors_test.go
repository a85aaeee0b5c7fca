package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/cenkalti/backoff/v4"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

func TestIsPermanent(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", errBoom, false},
		{"ours", middleware.Permanent(errBoom), true},
		{"ours wrapped twice", fmt.Errorf("a: %w", fmt.Errorf("b: %w", middleware.Permanent(errBoom))), true},
		{"backoff's", backoff.Permanent(errBoom), true},
		{"backoff's wrapped", fmt.Errorf("decode: %w", backoff.Permanent(errBoom)), true},
		{"in a join", errors.Join(errBoom, middleware.Permanent(errBoom)), true},
		{"a panic carrying one", &middleware.PanicError{Value: middleware.Permanent(errBoom)}, true},
		{"a panic carrying a string", &middleware.PanicError{Value: "bad"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := middleware.IsPermanent(tt.err); got != tt.want {
				t.Errorf("IsPermanent(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestPermanentNilIsNil(t *testing.T) {
	if err := middleware.Permanent(nil); err != nil {
		t.Fatalf("Permanent(nil) = %v, want nil", err)
	}
}

func TestPermanentKeepsCause(t *testing.T) {
	err := middleware.Permanent(errBoom)
	if !errors.Is(err, errBoom) || err.Error() != "boom" {
		t.Fatalf("Permanent(errBoom) = %q, must unwrap to errBoom and read the same", err)
	}
}

func TestRetriesExhaustedError(t *testing.T) {
	err := error(&middleware.RetriesExhaustedError{Attempts: 5, Last: errBoom})
	if !errors.Is(err, middleware.ErrRetriesExhausted) {
		t.Error("does not match ErrRetriesExhausted")
	}
	if !errors.Is(err, errBoom) {
		t.Error("does not unwrap to the last cause")
	}
	var ex *middleware.RetriesExhaustedError
	if !errors.As(fmt.Errorf("ctx: %w", err), &ex) || ex.Attempts != 5 {
		t.Errorf("errors.As through wrapping: %v", ex)
	}
	if got, want := err.Error(), "middleware: retries exhausted after 5 attempts: boom"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestInterruptedError(t *testing.T) {
	err := error(&middleware.InterruptedError{Attempt: 2, Reason: context.Canceled, Last: errBoom})
	for _, target := range []error{middleware.ErrInterrupted, context.Canceled, errBoom} {
		if !errors.Is(err, target) {
			t.Errorf("does not match %v", target)
		}
	}
	if got, want := err.Error(), "middleware: interrupted (context canceled) after attempt 2: boom; the message will be requeued"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestRecoveryError(t *testing.T) {
	publishErr := errors.New("publish not confirmed")
	err := error(&middleware.RecoveryError{Err: publishErr, Cause: middleware.Permanent(errBoom)})
	for _, target := range []error{middleware.ErrRecoveryFailed, publishErr, errBoom} {
		if !errors.Is(err, target) {
			t.Errorf("does not match %v", target)
		}
	}
}

func TestHandlerError(t *testing.T) {
	wrapped := fmt.Errorf("order 7: %w", errBoom)
	for _, err := range []error{
		wrapped,
		middleware.Permanent(wrapped),
		backoff.Permanent(wrapped),
		&middleware.RetriesExhaustedError{Attempts: 3, Last: middleware.Permanent(wrapped)},
	} {
		if got := chainrun.HandlerError(err); got != wrapped {
			t.Errorf("HandlerError(%T) = %v, want the handler's own error", err, got)
		}
	}
}

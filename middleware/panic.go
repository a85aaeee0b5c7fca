package middleware

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	amqp "github.com/rabbitmq/amqp091-go"
)

// PanicError is a handler panic turned into an error, so that it is retried,
// recovered and settled like any other failure instead of killing the process.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the goroutine's stack where the panic was caught
}

func (e *PanicError) Error() string { return fmt.Sprintf("middleware: handler panicked: %v", e.Value) }

// Unwrap returns the panic value when it is an error, so errors.Is and
// errors.As see through the panic (panic(Permanent(err)) is not retried).
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// CatchPanics turns a panic in the handlers below it into a *PanicError.
// Place it innermost, next to the handler, so that Retry retries panics:
// Chain(Retry(5), Recover(r), CatchPanics()). The listener always adds it
// around your handler.
func CatchPanics() Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, d *amqp.Delivery) (err error) {
			defer func() {
				if v := recover(); v != nil {
					err = &PanicError{Value: v, Stack: debug.Stack()}
				}
			}()
			if err = next(ctx, d); err != nil {
				err = vetted(err)
			}
			return err
		}
	}
}

// vetted returns err, or a *PanicError that describes it when looking into it
// panics: every middleware above, and the listener's settlement, look into
// errors with errors.Is and errors.As, which call the error's own Unwrap and
// Is methods, and a typed nil *MyErr whose Unwrap reads a field panics there.
// (An Error method that panics is harmless: whatever formats errors uses
// the same guard as recoverer.ErrorString.)
func vetted(err error) (checked error) {
	defer func() {
		if v := recover(); v != nil {
			checked = &PanicError{Value: fmt.Sprintf("the handler returned a %T whose Unwrap or Is method panicked: %v", err, v)}
		}
	}()
	_ = errors.Is(err, errNeverReturned)
	return err
}

var errNeverReturned = errors.New("middleware: looking into a handler's error")

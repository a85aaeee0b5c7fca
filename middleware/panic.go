package middleware

import (
	"context"
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
			return next(ctx, d)
		}
	}
}

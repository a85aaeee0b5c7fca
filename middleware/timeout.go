package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/errtext"
)

// ErrTimeout: the handler ran past the deadline Timeout gave it. See
// TimeoutError.
var ErrTimeout = errors.New("middleware: handler timed out")

// TimeoutError reports a call that ran past its Timeout. It matches
// ErrTimeout and unwraps to what the handler returned, if anything.
type TimeoutError struct {
	Timeout time.Duration // Timeout's d
	Took    time.Duration // how long the call ran
	// Ignored is true when the handler returned something other than its
	// context's error (nil included): it did not stop at the deadline.
	Ignored bool
	Last    error // what the handler returned, nil if it returned nil
}

func (e *TimeoutError) Error() string {
	msg := fmt.Sprintf("middleware: the handler ran %v, past Timeout(%v)", e.Took.Round(time.Millisecond), e.Timeout)
	if e.Ignored {
		msg += " and ignored its context's deadline"
	}
	if e.Last != nil {
		msg += ": " + errtext.String(e.Last)
	}
	return msg
}

func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }
func (e *TimeoutError) Unwrap() error        { return e.Last }

// Timeout gives each call through it a context with a deadline d later. A
// call that returns after the deadline fails with a *TimeoutError
// (ErrTimeout), whatever it returned: the work may be half done, and the
// broker may be about to take the delivery back (consumer_timeout). A
// handler that ignores the deadline cannot be stopped, only reported: when
// it finally returns something other than its context's error, the
// listener's logger (slog.Default outside a listener) gets a warning with
// the queue, the message id and how long it ran.
//
// Put it innermost, next to the handler, so that it bounds one attempt and
// Retry retries a timed-out one: Chain(Retry(3), Recover(r), Timeout(30*time.Second)).
// listener.New counts d toward the delivery's worst case, the Retries' waits
// plus d on every attempt, and refuses a chain that could outlast the
// broker's consumer_timeout. It refuses a Timeout around a Recover too:
// past the deadline the recoverer cannot run, so the delivery would be
// requeued and run again for ever. A Timeout between Recover and Retry,
// Chain(Recover(r), Timeout(d), Retry(3)), bounds every attempt together.
//
// Timeout panics if d <= 0.
func Timeout(d time.Duration) Middleware {
	if d <= 0 {
		panic(fmt.Sprintf("middleware: Timeout expects a duration > 0, got %v", d))
	}
	return func(next Handler) Handler {
		chainctx.TimeoutBuilt(d) // the listener's survey counts it as handler time
		return func(ctx context.Context, del *amqp.Delivery) error {
			tctx, cancel := context.WithTimeoutCause(ctx, d, ErrTimeout)
			defer cancel()
			deadline, _ := tctx.Deadline()
			start := time.Now()
			err := next(tctx, del)
			end := time.Now()
			took := end.Sub(start)
			// By the clock, not by the context's cause: the timer may fire
			// between a call that returned in time and this check.
			if ctx.Err() != nil || end.Before(deadline) {
				return err // in time, or the caller's context ended first
			}
			last := err
			var interrupted *InterruptedError
			if errors.As(err, &interrupted) && errors.Is(interrupted.Reason, context.DeadlineExceeded) {
				// A Retry inside gave up its wait at our deadline: a
				// timeout, not a shutdown, which would release the message.
				last = interrupted.Last
			}
			ignored := !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrInterrupted)
			if ignored {
				chainctx.Logger(ctx).Warn("middleware: a handler ignored the deadline Timeout gave it and returned late; "+
					"the delivery is treated as failed. Pass the context to what blocks (database, HTTP calls) so that it stops in time",
					"queue", chainctx.Queue(ctx), "message_id", del.MessageId, "timeout", d, "took", took.Round(time.Millisecond),
					"returned", errtext.String(err))
			}
			return &TimeoutError{Timeout: d, Took: took, Ignored: ignored, Last: last}
		}
	}
}

package middleware

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/telemetry"
)

// Recoverer takes a delivery whose processing has failed for good and puts it
// somewhere safe: a dead-letter exchange, a broker retry tier. Returning nil
// promises the message is safely elsewhere, so the original may be acked;
// returning an error means it is not, and the original is requeued.
type Recoverer interface {
	Recover(ctx context.Context, d *amqp.Delivery, cause error) error
}

// RecovererFunc adapts a function to Recoverer.
type RecovererFunc func(ctx context.Context, d *amqp.Delivery, cause error) error

// Recover implements Recoverer by calling f.
func (f RecovererFunc) Recover(ctx context.Context, d *amqp.Delivery, cause error) error {
	return f(ctx, d, cause)
}

// Recover hands a delivery whose processing failed for good to r. Inside a
// Retry it lets failures that Retry will retry pass up and recovers only the
// final one; outside, it recovers whatever error reaches it.
//
// Interruptions (ErrInterrupted, or a context that has ended) are never
// recovered: the listener requeues them. When r fails, Recover returns a
// *RecoveryError (ErrRecoveryFailed) and the listener requeues the message.
// When r returns an error matching ErrReject, the listener rejects the
// message without requeue. When r succeeds, Recover returns nil and the
// listener acks it.
func Recover(r Recoverer) Middleware {
	if r == nil {
		panic("middleware: Recover expects a non-nil Recoverer")
	}
	return func(next Handler) Handler {
		return func(ctx context.Context, d *amqp.Delivery) error {
			err := next(ctx, d)
			if err == nil || errors.Is(err, ErrInterrupted) || d == probeDelivery {
				return err // WorstCaseWait's dry run never reaches a recoverer
			}
			if cerr := ctx.Err(); cerr != nil {
				return &InterruptedError{Attempt: Attempt(ctx), Reason: cerr, Last: err}
			}
			select {
			case <-interruptFrom(ctx): // shutting down: requeue, never the DLQ
				return &InterruptedError{Attempt: Attempt(ctx), Reason: errInterruptSignalled, Last: err}
			default:
			}
			if willRetry(ctx, err) {
				return err
			}
			Park(ctx) // a recoverer does I/O, which may wait out an outage
			rerr := r.Recover(ctx, d, err)
			switch {
			case rerr == nil:
				recorded(ctx, outcomeRecovered, nil)
				if ac, ok := ctx.Value(attemptKey).(*attemptContext); ok {
					ac.exec.recovered = true // the Retry around reports the attempt as recovered
				}
				return nil
			case errors.Is(rerr, ErrReject):
				recorded(ctx, outcomeRejected, nil)
				return fmt.Errorf("%w; handler error: %w", rerr, err)
			default:
				recorded(ctx, outcomeRecoveryFailed, rerr)
				return &RecoveryError{Err: rerr, Cause: err}
			}
		}
	}
}

// WithQueue records the queue a delivery came from; amqp.Delivery does not
// carry it. The listener sets it, and recoverers write it into fault headers.
func WithQueue(ctx context.Context, queue string) context.Context {
	return context.WithValue(ctx, queueKey, queue)
}

// Queue returns the queue recorded by WithQueue, or "".
func Queue(ctx context.Context) string {
	q, _ := ctx.Value(queueKey).(string)
	return q
}

// Outcomes of amqpretry.recoveries and of the span event Recover adds.
const (
	outcomeRejected       = "rejected"
	outcomeRecoveryFailed = "failed"
)

// recorded counts a recovery and notes it on the current span: an attempt's
// from the second attempt on, else the delivery's process span.
func recorded(ctx context.Context, outcome string, err error) {
	tel := telemetry.From(ctx)
	tel.Recoveries.Add(ctx, 1, tel.Attrs("messaging.destination.name", Queue(ctx), AttrOutcome, outcome).Add...)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		attrs := []attribute.KeyValue{attribute.String(AttrOutcome, outcome)}
		if err != nil {
			attrs = append(attrs, attribute.String("exception.message", err.Error()))
		}
		span.AddEvent("recovery", trace.WithAttributes(attrs...))
	}
}

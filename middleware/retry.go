package middleware

import (
	"context"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/errtree"
	"github.com/amqpretry/amqpretry/internal/telemetry"
)

// Retry calls next up to maxAttempts times, the first call included (Spring's
// maxAttempts), waiting with exponential backoff between attempts. Retry(5)
// waits 1s, 2s, 4s and 8s.
//
// It stops early when an error is Permanent, when RetryIf says no, when the
// time limit would be passed, or when the wait is interrupted. When it stops
// for a Permanent error or RetryIf it returns that error (same message, same
// errors.Is and errors.As, with the count for chainrun.AttemptsMade). When attempts
// run out it returns a *RetriesExhaustedError (ErrRetriesExhausted) that
// unwraps to the last error; when the context ends or the listener shuts
// down, an *InterruptedError (ErrInterrupted), which the listener releases
// (nack with requeue: not the message's failure).
// Each delivery gets its own attempt counter and backoff state; the returned
// Middleware is safe to share.
//
// maxAttempts and the schedule options apply to every error unless
// RetryOn or NoRetryOn give its class a schedule of its own: see RetryOn.
//
// Retry panics if maxAttempts < 1 or an option is invalid, naming every
// problem at once.
func Retry(maxAttempts int, opts ...RetryOption) Middleware {
	o := defaultRetryOptions(maxAttempts)
	for _, opt := range opts {
		opt(&o)
	}
	if errs := o.check(); len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, err := range errs {
			msgs[i] = err.Error()
		}
		panic(strings.Join(msgs, "\n"))
	}
	o.errs = nil
	p := &retryPolicy{retryOptions: o, mostAttempts: o.maxAttempts, timed: o.maxElapsed > 0}
	for _, r := range o.rules {
		p.mostAttempts = max(p.mostAttempts, r.maxAttempts)
		p.timed = p.timed || r.maxElapsed > 0
	}
	if o.telemetry.TracerProvider != nil || o.telemetry.MeterProvider != nil {
		p.own = telemetry.New(o.telemetry)
	}
	worst := p.worstCaseWait()
	return func(next Handler) Handler {
		// The listener surveys the chain as it builds it, to compare
		// the waits with the broker's consumer_timeout.
		chainctx.RetryBuilt(worst, p.mostAttempts)
		return func(ctx context.Context, d *amqp.Delivery) error {
			return p.execute(ctx, d, next)
		}
	}
}

// retryPolicy is a built Retry: checked options, never changed once Retry
// has returned, shared by every delivery that goes through it. What changes
// during a delivery lives in its execution.
type retryPolicy struct {
	retryOptions
	mostAttempts int                  // the most attempts any rule, or Retry's own schedule, allows
	timed        bool                 // some schedule has a time limit: the execution notes its start
	own          *telemetry.Telemetry // from Retry's own providers; nil: none given
}

// telemetryFor is what an execution records with: the listener's telemetry
// (else the globals'), with the tracing or metrics half replaced by Retry's
// own where it was given a provider.
func (p *retryPolicy) telemetryFor(ctx context.Context) *telemetry.Telemetry {
	ownTracing, ownMetrics := p.telemetry.TracerProvider != nil, p.telemetry.MeterProvider != nil
	switch {
	case p.own == nil:
		return telemetry.From(ctx)
	case ownTracing && ownMetrics:
		return p.own
	case ownTracing:
		return telemetry.Combine(p.own, telemetry.From(ctx))
	default:
		return telemetry.Combine(telemetry.From(ctx), p.own)
	}
}

// Attempt returns the 1-based number of the attempt in progress, as counted by
// the nearest enclosing Retry; 1 when there is none.
func Attempt(ctx context.Context) int {
	if ac, ok := ctx.Value(attemptKey).(*attemptContext); ok {
		return ac.attempt
	}
	return 1
}

// attemptsMade reports how many attempts the Retry that returned err made
// (chainrun.AttemptsMade).
func attemptsMade(err error) (int, bool) {
	if ex, ok := errtree.As[*RetriesExhaustedError](err); ok {
		return ex.Attempts, true
	}
	if st, ok := errtree.As[*stoppedError](err); ok {
		return st.attempts, true
	}
	if counted, ok := errtree.As[interface{ AttemptsMade() int }](err); ok {
		return counted.AttemptsMade(), true
	}
	return 0, false
}

// stoppedError is the handler's error as Retry returns it when it stops
// early: it reads and unwraps as that error, and carries the attempt count
// for attemptsMade and the rule for RuleApplied, so that a Recover outside
// Retry can tell how many were made and why it stopped.
type stoppedError struct {
	attempts int
	rule     string
	err      error
}

func (e *stoppedError) Error() string { return e.err.Error() }
func (e *stoppedError) Unwrap() error { return e.err }

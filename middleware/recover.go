package middleware

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/errtext"
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
// message without requeue. When r returns an error matching ErrRedeliver,
// the listener returns the message to its queue at once, for the broker to
// deliver it again after the queue's delay. When r succeeds, Recover returns
// nil and the listener acks it.
//
// OnRecover options are told of every recovery, with its outcome.
func Recover(r Recoverer, opts ...RecoverOption) Middleware {
	if r == nil {
		panic("middleware: Recover expects a non-nil Recoverer")
	}
	var cfg recoverConfig
	for _, opt := range opts {
		if opt == nil {
			panic("middleware: Recover expects non-nil options")
		}
		opt(&cfg)
	}
	quick, _ := r.(quickRecoverer)
	return func(next Handler) Handler {
		// The listener surveys the chain as it builds it: deliveries past
		// their redelivery limit go to r without running the chain.
		chainctx.RecovererBuilt(r)
		return func(ctx context.Context, d *amqp.Delivery) error {
			err := next(ctx, d)
			if err == nil || errors.Is(err, ErrInterrupted) {
				return err
			}
			if cerr := ctx.Err(); cerr != nil {
				return &InterruptedError{Attempt: Attempt(ctx), Reason: cerr, Last: err}
			}
			select {
			case <-chainctx.Interrupt(ctx): // shutting down: requeue, never the DLQ
				return &InterruptedError{Attempt: Attempt(ctx), Reason: errInterruptSignalled, Last: err}
			default:
			}
			if willRetry(ctx, err) {
				return err
			}
			if stop := chainctx.Recovering(ctx, err); stop != nil {
				// The listener stopped consuming (its kill switch): the
				// message goes back to the queue, not to the recoverer.
				return &InterruptedError{Attempt: Attempt(ctx), Reason: stop, Last: err}
			}
			if ar, ok := r.(AsyncRecoverer); ok {
				if rctx, settlement, ok := chainctx.DeferSettlement(ctx); ok {
					if started, rerr := cfg.recoverAsync(ctx, rctx, ar, d, err, settlement); started {
						return rerr
					}
					settlement.Undo()
				}
			}
			if quick == nil || !quick.RecoversAtOnce(d, err) {
				chainctx.WillWait(ctx) // a recoverer does I/O, which may wait out an outage
			}
			rerr := r.Recover(ctx, d, err)
			return cfg.conclude(ctx, d, err, rerr, RuleApplied(ctx, err), recoveryAttempts(ctx, err), true)
		}
	}
}

// AsyncRecoverer is a Recoverer that can start its work and hear of its
// outcome later without a goroutine waiting for it: recoverer.Republish
// publishes the copy, and the listener acks the original when the broker's
// confirm arrives, in any order, while it goes on reading. Recover uses it
// where the listener can settle a delivery later (a listener's chain, not a
// batch's failures, nor a consumer of your own run through chainrun), and
// calls Recover everywhere else. The guarantees are Recover's: the original
// is acked only once done has said nil.
type AsyncRecoverer interface {
	Recoverer
	// RecoverAsync starts what Recover does and returns once it has
	// started (started true, err nil); then done is called exactly once,
	// later and possibly on another goroutine, with what Recover would have
	// returned. done settles the delivery: it is quick and does not block.
	// An error returned means it failed before anything was started: it is
	// Recover's error, and done is not called. started false with a nil
	// error means it cannot work so here (its publisher has no asynchronous
	// publish, say): nothing was done, and Recover is called instead.
	RecoverAsync(ctx context.Context, d *amqp.Delivery, cause error, done func(error)) (started bool, err error)
}

// quickRecoverer is a Recoverer that can tell, before Recover runs, that it
// will answer d at once, without I/O or a wait (dlx's Redeliver below the
// last delivery: the broker redelivers it). Recover then does not tell the
// listener that the delivery will wait, and the listener's reader goes on
// with it instead of handing the reading to a new goroutine, as it does
// before a recovery that may wait out an outage: for a queue that hands
// back every failure, a new goroutine per failure, its stack grown anew
// each time, was the largest cost of a failure left in the listener.
type quickRecoverer interface {
	RecoversAtOnce(d *amqp.Delivery, cause error) bool
}

// recoverAsync hands the delivery to ar and returns at once; settlement's
// Outcome tells the listener the chain's result once ar's is known. Middlewares outside
// Recover see nil (or an error that was known at once) as the chain's
// result; OnRecover hooks and telemetry hear of the outcome when it comes,
// on whatever goroutine brings it. ctx is the chain's, rctx the one for the
// recoverer's work, which only the listener ends.
// started is false when ar cannot work so: nothing was done.
func (cfg *recoverConfig) recoverAsync(ctx, rctx context.Context, ar AsyncRecoverer, d *amqp.Delivery, cause error, settlement chainctx.DeferredSettlement) (started bool, err error) {
	// What conclude reads of the chain's state is read now, on the chain's
	// goroutine.
	rule, attempts := RuleApplied(ctx, cause), recoveryAttempts(ctx, cause)
	started, err = ar.RecoverAsync(rctx, d, cause, func(rerr error) {
		settlement.Outcome(cfg.conclude(ctx, d, cause, rerr, rule, attempts, false))
	})
	if err != nil {
		err = cfg.conclude(ctx, d, cause, err, rule, attempts, true)
		settlement.Outcome(err)
		return true, err
	}
	if !started {
		return false, nil
	}
	if ac, ok := ctx.Value(attemptKey).(*attemptContext); ok {
		// The Retry around reports the attempt as it returns, before the
		// outcome: as recovered, which it is unless the copy is lost.
		ac.exec.recovered = true
	}
	return true, nil
}

// conclude records and tells a recovery's outcome, rerr being the
// recoverer's result, and returns the chain's: nil when recovered. inChain
// is whether it runs in the chain, before Recover returns (not on the
// goroutine that brought an asynchronous outcome).
func (cfg *recoverConfig) conclude(ctx context.Context, d *amqp.Delivery, cause, rerr error, rule string, attempts int, inChain bool) error {
	switch {
	case rerr == nil:
		chainctx.RecoveredTo(ctx, "", attempts)
		recorded(ctx, telemetry.OutcomeRecovered, nil, rule)
		cfg.tell(ctx, d, cause, nil, telemetry.OutcomeRecovered, rule, attempts)
		if ac, ok := ctx.Value(attemptKey).(*attemptContext); ok && inChain {
			ac.exec.recovered = true // the Retry around reports the attempt as recovered
		}
		return nil
	case errors.Is(rerr, ErrReject):
		recorded(ctx, telemetry.OutcomeRejected, nil, rule)
		cfg.tell(ctx, d, cause, rerr, telemetry.OutcomeRejected, rule, attempts)
		return &handedBackError{errs: [2]error{rerr, cause}}
	case errors.Is(rerr, ErrRedeliver):
		recorded(ctx, telemetry.OutcomeRedelivered, nil, rule)
		cfg.tell(ctx, d, cause, rerr, telemetry.OutcomeRedelivered, rule, attempts)
		return &handedBackError{errs: [2]error{rerr, cause}}
	default:
		recorded(ctx, telemetry.OutcomeRecoveryFailed, rerr, rule)
		cfg.tell(ctx, d, cause, rerr, telemetry.OutcomeRecoveryFailed, rule, attempts)
		return &RecoveryError{Err: rerr, Cause: cause}
	}
}

// handedBackError is the chain's answer when the recoverer asked the
// listener to settle the message (ErrReject, ErrRedeliver): it matches both
// the recoverer's answer and the handler's error, as
// fmt.Errorf("%w; handler error: %w") would, but formats them only when
// asked. A queue that redelivers every failure (dlx's Redeliver) returns one
// per delivery, and formatting both errors each time, for text that is
// seldom read, was the largest cost of a failure.
type handedBackError struct {
	// The recoverer's answer (matching ErrReject or ErrRedeliver), then
	// the handler's error: Unwrap's slice, which the listener walks
	// several times per failure, made once.
	errs [2]error
}

// Error is the text fmt.Errorf("%w; handler error: %w", answer, cause) has,
// whatever the two errors' Error methods do.
func (e *handedBackError) Error() string {
	return fmt.Sprintf("%v; handler error: %v", e.errs[0], e.errs[1])
}

func (e *handedBackError) Unwrap() []error { return e.errs[:] }

// DeadLettered tells the listener where a Recoverer of your own put a
// delivery for good (a dead-letter queue of its own, a table of failures): it
// names that place in its dead-letter log line. Call it from Recover before
// returning nil. Without it the listener still counts the recovery as a dead
// letter (Stats.Recovered and Stats.DeadLettered, the amqpretry.dead_lettered
// metric, the log line), saying the recoverer did not say where.
// recoverer.Republish calls it for you. Outside a listener it does nothing.
func DeadLettered(ctx context.Context, where string) {
	chainctx.RecoveredTo(ctx, where, 0)
}

// RetryScheduled tells the listener that a Recoverer of your own handed the
// delivery on to another try later (a retry queue, a scheduler) rather than
// for good: the listener counts it in Stats.Recovered but not as a dead
// letter, and logs nothing for it. Call it from Recover before returning nil.
// The broker-side retry tiers (dlx) call it for you.
func RetryScheduled(ctx context.Context, where string) {
	chainctx.RecoveredTo(chainctx.WithRetryHop(ctx), where, 0)
}

// recoveryAttempts is how many attempts a recovered delivery had: Retry's
// count from cause, or the attempt in progress.
func recoveryAttempts(ctx context.Context, cause error) int {
	if n, ok := attemptsMade(cause); ok {
		return n
	}
	return Attempt(ctx)
}

// recorded counts a recovery and notes it on the current span: an attempt's
// from the second attempt on, else the delivery's process span.
func recorded(ctx context.Context, outcome telemetry.Outcome, err error, rule string) {
	tel := telemetry.From(ctx)
	tel.Recoveries.Add(ctx, 1, tel.ForQueue(chainctx.Queue(ctx)).Outcome(outcome).Add...)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		attrs := []attribute.KeyValue{outcome.Attr()}
		if err != nil {
			attrs = append(attrs, attribute.String(telemetry.KeyExceptionMessage, errtext.String(err)))
		}
		if rule != "" {
			attrs = append(attrs, attribute.String(telemetry.KeyRetryRule, rule))
		}
		span.AddEvent("recovery", trace.WithAttributes(attrs...))
	}
}

// RecoverOption configures Recover.
type RecoverOption func(*recoverConfig)

type recoverConfig struct {
	hooks []func(ctx context.Context, e RecoverEvent)
}

// RecoverEvent is what an OnRecover hook is told.
type RecoverEvent struct {
	Delivery *amqp.Delivery
	Cause    error // the failure the recoverer was handed
	// Outcome is "recovered" (the recoverer put the message elsewhere and it
	// is acked), "rejected" (it asked for a reject without requeue),
	// "redelivered" (it handed the message back for the broker to deliver
	// again) or "failed" (it could not, and the message is requeued).
	Outcome string
	Err     error  // the recoverer's error; nil when recovered
	Attempt int    // the attempts the delivery had (Retry's count, or the attempt in progress)
	Rule    string // the rule of Retry that applied to Cause (RuleApplied); "" when Retry has none
}

// OnRecover calls hook after every recovery, on the delivery's goroutine,
// with its outcome: Spring Retry's RetryListener.close, MassTransit's fault
// observers. The listener already logs every dead letter and counts it in
// Stats, whichever recoverer put it away (see DeadLettered); use the hook to
// alert, count by cause, or audit. A hook must not
// block for long or settle the delivery.
func OnRecover(hook func(ctx context.Context, e RecoverEvent)) RecoverOption {
	if hook == nil {
		panic("middleware: OnRecover expects a non-nil hook")
	}
	return func(c *recoverConfig) { c.hooks = append(c.hooks, hook) }
}

func (c *recoverConfig) tell(ctx context.Context, d *amqp.Delivery, cause, err error, outcome telemetry.Outcome, rule string, attempt int) {
	if len(c.hooks) == 0 {
		return
	}
	e := RecoverEvent{Delivery: d, Cause: cause, Outcome: outcome.String(), Err: err, Attempt: attempt, Rule: rule}
	for _, hook := range c.hooks {
		callHook(ctx, hook, e)
	}
}

// callHook keeps a hook's panic from undoing the recovery (a panic would
// requeue a message that is safely elsewhere already): it is logged instead.
func callHook(ctx context.Context, hook func(context.Context, RecoverEvent), e RecoverEvent) {
	defer func() {
		if v := recover(); v != nil {
			chainctx.Logger(ctx).Error("middleware: an OnRecover hook panicked; the recovery stands", "panic", fmt.Sprint(v), "outcome", e.Outcome)
		}
	}()
	hook(ctx, e)
}

package middleware

import (
	"context"
	"fmt"
	"strings"

	"github.com/amqpretry/amqpretry/internal/errtree"
)

// retryRule is a RetryOn or a NoRetryOn: the errors of its class get its
// schedule instead of Retry's own.
type retryRule struct {
	class ErrorClass
	schedule
	notRetryable bool // NoRetryOn: returned at once, as RetryIf's no
}

// RetryOn gives the errors of class a schedule of their own, in place of
// Retry's: up to maxAttempts attempts, waits from the schedule options given
// here (WithInitialInterval, WithMultiplier, WithMaxInterval, WithJitter,
// WithMaxElapsedTime, HandOffAfter), starting from the defaults (1s, ×2,
// capped at 10s), not from the options given to Retry. Spring's
// ExceptionClassifierRetryPolicy, MassTransit's Handle<T> with its own
// intervals:
//
//	middleware.Retry(3, // 3 attempts, 1s and 2s apart, for errors no rule names
//		middleware.RetryOn(timeouts, 5, middleware.WithInitialInterval(100*time.Millisecond)),
//		middleware.RetryOn(rateLimited, 4, middleware.WithInitialInterval(20*time.Second), middleware.WithMultiplier(1)),
//		middleware.NoRetryOn(invalid),
//	)
//
// After each failed attempt the first rule, in the order given, whose class
// the error belongs to decides; RetryIf applies only to errors no rule
// matches, and a Permanent error is never retried, whatever its class.
// When a delivery fails with errors of different classes, the rule of the
// latest error decides, with two counts: the attempt number is the
// delivery's (attempt 4 failing with a timeout is retried only if the
// timeout rule allows more than 4 attempts), and the waits follow each
// rule's own schedule, advanced by its own failures only (a timeout after
// a rate limit waits the timeout rule's next interval).
//
// The rule that decided is reported as the class's name ("default" for
// Retry's own schedule): by RuleApplied, in RetryEvent, RecoverEvent and
// RetriesExhaustedError, on the attempt spans (AttrRetryRule) and in the
// dead letters of recoverer.Republish. Retry panics when two rules share a
// name, when class is the zero ErrorClass, or when an option here is not a
// schedule option.
func RetryOn(class ErrorClass, maxAttempts int, opts ...RetryOption) RetryOption {
	return func(o *retryOptions) { o.addRule("RetryOn", class, maxAttempts, opts, false) }
}

// NoRetryOn returns the errors of class at once, unchanged, as RetryIf does
// for an error it does not retry (MassTransit's Ignore<T>): a Recover inside
// or around Retry recovers it after its first attempt. See RetryOn for how
// rules are chosen and reported.
func NoRetryOn(class ErrorClass) RetryOption {
	return func(o *retryOptions) { o.addRule("NoRetryOn", class, 1, nil, true) }
}

// addRule checks and adds a rule, recording what is wrong with it.
func (o *retryOptions) addRule(ctor string, class ErrorClass, maxAttempts int, opts []RetryOption, notRetryable bool) {
	if !class.valid() {
		o.errs = append(o.errs, fmt.Errorf("middleware: %s expects an ErrorClass made by ErrorIs, ErrorAs or ErrorFunc, got the zero ErrorClass", ctor))
		return
	}
	owner := fmt.Sprintf("%s(%q)", ctor, class.name)
	for _, r := range o.rules {
		if r.class.name == class.name {
			o.errs = append(o.errs, fmt.Errorf("middleware: %s: another rule of this Retry has the name %q; the fault headers and spans name the rule that applied, so names must differ", owner, class.name))
			return
		}
	}
	ro := retryOptions{schedule: defaultSchedule(maxAttempts)}
	for i, opt := range opts {
		if opt == nil {
			o.errs = append(o.errs, fmt.Errorf("middleware: %s expects non-nil options, got nil at index %d", owner, i))
			continue
		}
		opt(&ro)
	}
	o.errs = append(o.errs, ro.schedule.check(owner, "middleware: "+owner+": ")...)
	o.errs = append(o.errs, ro.errs...)
	var misplaced []string
	if ro.retryIf != nil {
		misplaced = append(misplaced, "RetryIf")
	}
	if ro.onRetry != nil {
		misplaced = append(misplaced, "OnRetry")
	}
	if ro.telemetry.TracerProvider != nil {
		misplaced = append(misplaced, "WithTracerProvider")
	}
	if ro.telemetry.MeterProvider != nil {
		misplaced = append(misplaced, "WithMeterProvider")
	}
	if ro.clock != nil {
		misplaced = append(misplaced, "a clock")
	}
	if len(ro.rules) > 0 {
		misplaced = append(misplaced, "RetryOn or NoRetryOn")
	}
	if len(misplaced) > 0 {
		o.errs = append(o.errs, fmt.Errorf("middleware: %s takes schedule options only (WithInitialInterval, WithMultiplier, WithMaxInterval, WithJitter, WithMaxElapsedTime, HandOffAfter), got %s: give it to Retry itself",
			owner, strings.Join(misplaced, ", ")))
	}
	o.rules = append(o.rules, retryRule{class: class, schedule: ro.schedule, notRetryable: notRetryable})
}

// ruleFor returns the index of the first rule whose class err belongs to,
// or -1.
func (p *retryPolicy) ruleFor(err error) int {
	for i := range p.rules {
		if p.rules[i].class.Matches(err) {
			return i
		}
	}
	return -1
}

// RuleApplied names the rule of the nearest Retry that decided what became
// of the failure cause: the ErrorClass name of a RetryOn or NoRetryOn, or
// "default" for Retry's own schedule; "" when that Retry has no rules, or
// cause did not go through one. A Recoverer reads it here: inside Retry,
// from ctx, for the attempt that has just failed; outside, from the error
// Retry returned. recoverer.Republish writes it into the dead letter.
func RuleApplied(ctx context.Context, cause error) string {
	if ex, ok := errtree.As[*RetriesExhaustedError](cause); ok {
		return ex.Rule
	}
	if st, ok := errtree.As[*stoppedError](cause); ok {
		return st.rule
	}
	if ac, ok := ctx.Value(attemptKey).(*attemptContext); ok && ac.exec.decidedFor == ac.attempt {
		return ac.exec.policy.ruleName(ac.exec.decision.rule)
	}
	return ""
}

package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/telemetry"
)

// execution is one delivery's pass through a Retry: it is never shared between
// deliveries, so its backoff state needs no lock.
type execution struct {
	policy      *retryPolicy
	tel         *telemetry.Telemetry
	attrs       *telemetry.QueueAttrs
	firstStart  int64 // telemetry.Mono() when a traced first attempt began
	firstTraced bool  // the first attempt ran under a recording span
	recovered   bool  // a Recover below handed the delivery to its recoverer
	first       attemptContext
	start       time.Time
	backoff     *backoff.ExponentialBackOff    // Retry's own schedule, created on its first failure
	ruleBackoff *[]*backoff.ExponentialBackOff // the rules' schedules, created on a rule's first failure
	decidedFor  int                            // the attempt whose decision is cached
	decision    decision
}

// execute runs one delivery through the policy: attempts, the decision after
// each failure, and the waits between them.
func (p *retryPolicy) execute(ctx context.Context, d *amqp.Delivery, next Handler) error {
	tel := p.telemetryFor(ctx)
	ex := &execution{policy: p, tel: tel, attrs: tel.ForQueue(chainctx.Queue(ctx))}
	if p.timed {
		ex.start = p.clock.Now()
	}
	attempt := 1
	for {
		actx, span := ex.startAttempt(ctx, attempt)
		err := next(actx, d)
		if err == nil {
			outcome, rule := telemetry.OutcomeSucceeded, ""
			if ex.recovered { // failed, and a Recover below asked what the rules say
				outcome = telemetry.OutcomeRecovered
				if ex.decidedFor == attempt {
					rule = p.ruleName(ex.decision.rule)
				}
			}
			ex.endAttempt(ctx, span, outcome, nil, rule)
			return nil
		}
		span = ex.failedFirst(ctx, attempt, span)
		if errors.Is(err, ErrInterrupted) {
			ex.endAttempt(ctx, span, telemetry.OutcomeInterrupted, err, "")
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			ex.endAttempt(ctx, span, telemetry.OutcomeInterrupted, err, "")
			return &InterruptedError{Attempt: attempt, Reason: cerr, Last: err}
		}
		dec := ex.decide(attempt, err)
		rule := p.ruleName(dec.rule)
		if !dec.retry {
			ex.endAttempt(ctx, span, dec.outcome(), err, rule)
			return dec.finalError(attempt, err, rule)
		}
		ex.retryScheduled(span, dec.delay)
		ex.endAttempt(ctx, span, telemetry.OutcomeRetrying, err, rule)
		tel.Retries.Add(ctx, 1, ex.attrs.Queue.Add...)
		if p.onRetry != nil {
			p.onRetry(ctx, RetryEvent{Delivery: d, Attempt: attempt, Err: err, Delay: dec.delay, Rule: rule})
		}
		if werr := ex.wait(ctx, dec.delay); werr != nil {
			return &InterruptedError{Attempt: attempt, Reason: werr, Last: err}
		}
		attempt++
	}
}

// wait waits out a backoff, holding no worker, until the delay has passed,
// ctx ends or the listener shuts down.
//
// Retry calls next once per attempt, so a concurrency gate around the
// innermost handler only (the listener runs mw(gate(h))) is held while the
// handler runs and free while the delivery sleeps here: other deliveries use
// the worker meanwhile. A middleware between Retry and the handler that
// holds a worker would hold it through the waits. chainctx.WillWait tells the
// listener first, which hands the reading of its consumer's deliveries to
// another goroutine (listener/consumer.go), so that a waiting delivery
// never stalls its consumer.
func (ex *execution) wait(ctx context.Context, delay time.Duration) error {
	chainctx.WillWait(ctx)
	ex.tel.Parked.Add(ctx, 1, ex.attrs.Queue.Add...)
	err := ex.policy.clock.Wait(ctx, chainctx.Interrupt(ctx), delay)
	ex.tel.Parked.Add(ctx, -1, ex.attrs.Queue.Add...)
	return err
}

// attemptContext carries the attempt number and the delivery's execution to
// the middlewares and handler below Retry. One struct instead of
// context.WithValue keeps the success path to a single allocation.
type attemptContext struct {
	context.Context
	exec    *execution
	attempt int
}

type ctxKey int

// attemptKey finds the attemptContext of the nearest Retry.
const attemptKey ctxKey = 0

func (c *attemptContext) Value(key any) any {
	switch {
	case key == attemptKey:
		return c
	case key == telemetry.ContextKey() && c.exec.policy.own != nil:
		return c.exec.tel // Retry's own providers reach the middlewares below it
	}
	return c.Context.Value(key)
}

type stopReason uint8

const (
	keepRetrying stopReason = iota
	stopPermanent
	stopNotRetryable
	stopAttempts
	stopTimeLimit
	stopHandOff
)

// decision is what happens after a failed attempt.
type decision struct {
	delay time.Duration
	retry bool
	stop  stopReason
	rule  ruleRef // the schedule that decided
}

// ruleRef is which schedule decided: none when Retry has no rules, Retry's
// own, or a rule's (an index, not the name: an execution is allocated per
// delivery, and kept small).
type ruleRef int32

const (
	noRules     ruleRef = 0
	ownSchedule ruleRef = 1 // then 2+i for rules[i]
)

// ruleName is what RuleApplied reports for r.
func (p *retryPolicy) ruleName(r ruleRef) string {
	switch r {
	case noRules:
		return ""
	case ownSchedule:
		return DefaultRule
	}
	return p.rules[r-2].class.name
}

// outcome is how the attempt ended, for its span and amqpretry.attempts.
func (d decision) outcome() telemetry.Outcome {
	switch d.stop {
	case stopPermanent:
		return telemetry.OutcomePermanent
	case stopNotRetryable:
		return telemetry.OutcomeNotRetryable
	case stopTimeLimit:
		return telemetry.OutcomeTimeLimited
	case stopHandOff:
		return telemetry.OutcomeHandedOff
	}
	return telemetry.OutcomeExhausted
}

func (d decision) finalError(attempt int, err error, rule string) error {
	switch d.stop {
	case stopAttempts:
		return &RetriesExhaustedError{Attempts: attempt, Last: err, Rule: rule}
	case stopTimeLimit:
		return &RetriesExhaustedError{Attempts: attempt, Last: err, TimeLimited: true, Rule: rule}
	case stopHandOff:
		return &RetriesExhaustedError{Attempts: attempt, Last: err, HandedOff: true, Rule: rule}
	default: // permanent or not retryable: the caller's error, with the count attached
		return &stoppedError{attempts: attempt, rule: rule, err: err}
	}
}

// decide says whether the given failed attempt will be retried, and after
// which delay. The decision is made once per attempt and cached, so that
// Recover (asking from inside the chain) and Retry (acting on it) agree even
// with jitter.
func (ex *execution) decide(attempt int, err error) decision {
	if ex.decidedFor == attempt {
		return ex.decision
	}
	p := ex.policy
	var dec decision
	rule, s := -1, &p.schedule // Retry's own, for errors no rule matches
	if len(p.rules) > 0 {
		dec.rule = ownSchedule
		if rule = p.ruleFor(err); rule >= 0 {
			s, dec.rule = &p.rules[rule].schedule, ownSchedule+1+ruleRef(rule)
		}
	}
	switch {
	case IsPermanent(err):
		dec.stop = stopPermanent
	case rule >= 0 && p.rules[rule].notRetryable:
		dec.stop = stopNotRetryable
	case rule < 0 && p.retryIf != nil && !p.retryIf(err):
		dec.stop = stopNotRetryable
	case attempt >= s.maxAttempts: // the delivery's attempts, whatever the earlier errors were
		dec.stop = stopAttempts
	default:
		delay := ex.nextDelay(rule, s)
		switch {
		case s.handOffSet && delay > s.handOff:
			dec.stop = stopHandOff
		case s.maxElapsed > 0 && p.clock.Now().Sub(ex.start)+delay > s.maxElapsed:
			dec.stop = stopTimeLimit
		default:
			dec.retry, dec.delay = true, delay
		}
	}
	ex.decidedFor, ex.decision = attempt, dec
	return dec
}

// nextDelay advances the backoff of the schedule s (rule -1: Retry's own),
// which only that schedule's failures move on.
func (ex *execution) nextDelay(rule int, s *schedule) time.Duration {
	b := &ex.backoff
	if rule >= 0 {
		if ex.ruleBackoff == nil {
			states := make([]*backoff.ExponentialBackOff, len(ex.policy.rules))
			ex.ruleBackoff = &states
		}
		b = &(*ex.ruleBackoff)[rule]
	}
	if *b == nil {
		*b = &backoff.ExponentialBackOff{
			InitialInterval:     s.initial,
			RandomizationFactor: s.jitter,
			Multiplier:          s.multiplier,
			MaxInterval:         s.maxInterval,
			MaxElapsedTime:      0, // we enforce our own limit; backoff/v4 would stop at 15 minutes
			Stop:                backoff.Stop,
			Clock:               ex.policy.clock,
		}
		(*b).Reset()
	}
	return (*b).NextBackOff()
}

// willRetry reports whether the Retry enclosing ctx will retry err after the
// current attempt. Recover uses it to leave retryable failures to Retry.
func willRetry(ctx context.Context, err error) bool {
	ac, ok := ctx.Value(attemptKey).(*attemptContext)
	if !ok {
		return false
	}
	return ac.exec.decide(ac.attempt, err).retry
}

// errInterruptSignalled is the Reason of an InterruptedError caused by the
// listener shutting down.
var errInterruptSignalled = errors.New("interrupt signalled, shutting down")

// clock is time as Retry sees it; tests substitute a fake one.
type clock interface {
	Now() time.Time
	// Wait blocks for d, returning early with the reason when ctx ends or
	// interrupt closes.
	Wait(ctx context.Context, interrupt <-chan struct{}, d time.Duration) error
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Wait(ctx context.Context, interrupt <-chan struct{}, d time.Duration) error {
	if err := interrupted(ctx, interrupt); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-interrupt:
		return errInterruptSignalled
	case <-t.C:
		return nil
	}
}

// interrupted returns the reason when ctx has ended or interrupt has
// closed already: a clock checks it first, so that it wins over a timer
// that is also ready.
func interrupted(ctx context.Context, interrupt <-chan struct{}) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-interrupt:
		return errInterruptSignalled
	default:
		return nil
	}
}

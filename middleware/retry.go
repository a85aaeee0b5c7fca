package middleware

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/telemetry"
)

// Default backoff of Retry: 1s, 2s, 4s, 8s, then 10s between attempts.
const (
	DefaultInitialInterval = time.Second
	DefaultMultiplier      = 2.0
	DefaultMaxInterval     = 10 * time.Second
)

// RetryEvent describes a failed attempt that Retry is about to retry.
type RetryEvent struct {
	Delivery *amqp.Delivery
	Attempt  int           // the attempt that failed, 1-based
	Err      error         // its error
	Delay    time.Duration // the wait before attempt Attempt+1
}

// RetryOption configures Retry. Options are applied to a copy of the defaults;
// an invalid value makes Retry panic with the option's name and the value.
type RetryOption func(*retryPolicy)

// WithInitialInterval sets the wait after the first failed attempt (Spring's
// initialInterval). Default 1s.
func WithInitialInterval(d time.Duration) RetryOption {
	return func(p *retryPolicy) { p.initial = d }
}

// WithMultiplier sets the factor by which each wait grows (Spring's
// multiplier); 1 gives a constant wait. Default 2.
func WithMultiplier(m float64) RetryOption {
	return func(p *retryPolicy) { p.multiplier = m }
}

// WithMaxInterval caps a single wait (Spring's maxInterval). Default 10s.
func WithMaxInterval(d time.Duration) RetryOption {
	return func(p *retryPolicy) { p.maxInterval = d }
}

// WithJitter randomises each wait by ±factor (0 ≤ factor ≤ 1) so that many
// consumers failing together do not retry in lockstep. Default 0.
func WithJitter(factor float64) RetryOption {
	return func(p *retryPolicy) { p.jitter = factor }
}

// WithMaxElapsedTime bounds the time from the first attempt's start: Retry
// does not begin a wait that would end after it. Default 0, no limit (unlike
// backoff/v4, whose default of 15 minutes would silently cap long policies).
func WithMaxElapsedTime(d time.Duration) RetryOption {
	return func(p *retryPolicy) { p.maxElapsed = d }
}

// HandOffAfter stops local retries when the next wait would be longer than
// threshold: Retry returns a *RetriesExhaustedError with HandedOff set, and a
// Recover inside or around it hands the delivery to its recoverer, typically
// the broker-side retry tiers of package dlx, instead of holding it in memory:
//
//	Chain(Retry(10, HandOffAfter(5*time.Second)), Recover(topology.Tiers(pub)))
//
// waits 1s, 2s, 4s locally, then parks the message in the tiers.
func HandOffAfter(threshold time.Duration) RetryOption {
	return func(p *retryPolicy) { p.handOff = threshold; p.handOffSet = true }
}

// WithTracerProvider sets where Retry's attempt spans go. Without it, the
// tracer provider comes from the listener Retry runs in (whatever Retry's
// meter provider is), else from the global one.
func WithTracerProvider(tp trace.TracerProvider) RetryOption {
	return func(p *retryPolicy) { p.telemetry.TracerProvider = tp }
}

// WithMeterProvider sets where Retry's metrics (amqpretry.attempts,
// amqpretry.retries, amqpretry.deliveries.parked) go. Without it, the meter
// provider comes from the listener Retry runs in (whatever Retry's tracer
// provider is), else from the global one.
func WithMeterProvider(mp metric.MeterProvider) RetryOption {
	return func(p *retryPolicy) { p.telemetry.MeterProvider = mp }
}

// RetryIf retries only errors for which retryable returns true; the others are
// returned at once, unchanged (and recovered by Recover). Permanent errors are
// never retried, whatever retryable says.
func RetryIf(retryable func(error) bool) RetryOption {
	return func(p *retryPolicy) {
		if retryable == nil {
			panic("middleware: RetryIf expects a non-nil function")
		}
		p.retryIf = retryable
	}
}

// OnRetry calls hook after a failed attempt, before Retry waits for the next
// one. It runs on the delivery's goroutine: keep it quick.
func OnRetry(hook func(ctx context.Context, e RetryEvent)) RetryOption {
	return func(p *retryPolicy) {
		if hook == nil {
			panic("middleware: OnRetry expects a non-nil function")
		}
		p.onRetry = hook
	}
}

// Retry calls next up to maxAttempts times, the first call included (Spring's
// maxAttempts), waiting with exponential backoff between attempts. Retry(5)
// waits 1s, 2s, 4s and 8s.
//
// It stops early when an error is Permanent, when RetryIf says no, when the
// time limit would be passed, or when the wait is interrupted. When it stops
// for a Permanent error or RetryIf it returns that error (same message, same
// errors.Is and errors.As, with the count for Attempts). When attempts run
// out it returns a *RetriesExhaustedError (ErrRetriesExhausted) that unwraps
// to the last error; when the context ends or the interrupt channel
// (WithInterrupt) closes, an *InterruptedError (ErrInterrupted), which the
// listener requeues. Each delivery gets its own attempt counter and backoff
// state; the returned Middleware is safe to share.
//
// Retry panics if maxAttempts < 1 or an option is invalid.
func Retry(maxAttempts int, opts ...RetryOption) Middleware {
	if maxAttempts < 1 {
		panic(fmt.Sprintf("middleware: Retry expects maxAttempts >= 1, got %d", maxAttempts))
	}
	p := &retryPolicy{
		maxAttempts: maxAttempts,
		initial:     DefaultInitialInterval,
		multiplier:  DefaultMultiplier,
		maxInterval: DefaultMaxInterval,
		clock:       systemClock{},
	}
	for _, opt := range opts {
		opt(p)
	}
	if err := p.validate(); err != nil {
		panic(err.Error())
	}
	if p.telemetry != (telemetry.Config{}) {
		p.tel = telemetry.New(p.telemetry)
	}
	return func(next Handler) Handler {
		return func(ctx context.Context, d *amqp.Delivery) error {
			return p.run(ctx, d, next)
		}
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

// WithInterrupt returns a context under which Retry stops waiting as soon as
// interrupt is closed, returning an *InterruptedError, while handlers that are
// running keep ctx and may finish. The listener uses it for graceful shutdown:
// deliveries in backoff are requeued at once, running handlers get a grace
// period.
func WithInterrupt(ctx context.Context, interrupt <-chan struct{}) context.Context {
	return context.WithValue(ctx, interruptKey, interrupt)
}

// errInterruptSignalled is the Reason of an InterruptedError caused by the
// channel given to WithInterrupt.
var errInterruptSignalled = errors.New("interrupt signalled, shutting down")

type ctxKey int

const (
	attemptKey ctxKey = iota
	interruptKey
	probeKey
	queueKey
	parkerKey
)

type retryPolicy struct {
	maxAttempts int
	initial     time.Duration
	multiplier  float64
	maxInterval time.Duration
	jitter      float64
	maxElapsed  time.Duration
	handOff     time.Duration
	handOffSet  bool
	retryIf     func(error) bool
	onRetry     func(context.Context, RetryEvent)
	clock       clock
	telemetry   telemetry.Config
	tel         *telemetry.Telemetry // built from its own providers; nil: none given
	mixed       atomic.Pointer[mixedTelemetry]
}

// mixedTelemetry is Retry's own provider combined with the other one of the
// telemetry around it (base), cached for that base.
type mixedTelemetry struct {
	base, tel *telemetry.Telemetry
}

// telemetryFor is what Retry records with: its own providers where it has
// them, the listener's (or the globals') for the rest.
func (p *retryPolicy) telemetryFor(ctx context.Context) *telemetry.Telemetry {
	base := telemetry.From(ctx)
	switch {
	case p.tel == nil:
		return base
	case p.telemetry.TracerProvider != nil && p.telemetry.MeterProvider != nil:
		return p.tel
	}
	if m := p.mixed.Load(); m != nil && m.base == base {
		return m.tel
	}
	mixed := telemetry.Mix(base, p.tel) // its own meter, the other's tracer
	if p.telemetry.TracerProvider != nil {
		mixed = telemetry.Mix(p.tel, base)
	}
	p.mixed.Store(&mixedTelemetry{base: base, tel: mixed})
	return mixed
}

func (p *retryPolicy) validate() error {
	switch {
	case p.initial <= 0:
		return fmt.Errorf("middleware: WithInitialInterval expects a duration > 0, got %v", p.initial)
	case math.IsNaN(p.multiplier) || math.IsInf(p.multiplier, 0) || p.multiplier < 1:
		return fmt.Errorf("middleware: WithMultiplier expects a finite factor >= 1, got %v", p.multiplier)
	case p.maxInterval < p.initial:
		return fmt.Errorf("middleware: WithMaxInterval expects a duration >= the initial interval %v, got %v", p.initial, p.maxInterval)
	case math.IsNaN(p.jitter) || p.jitter < 0 || p.jitter > 1:
		return fmt.Errorf("middleware: WithJitter expects a factor between 0 and 1, got %v", p.jitter)
	case p.maxElapsed < 0:
		return fmt.Errorf("middleware: WithMaxElapsedTime expects a duration >= 0 (0 means no limit), got %v", p.maxElapsed)
	case p.handOffSet && p.handOff <= 0:
		return fmt.Errorf("middleware: HandOffAfter expects a duration > 0, got %v", p.handOff)
	}
	return nil
}

func (p *retryPolicy) run(ctx context.Context, d *amqp.Delivery, next Handler) error {
	if d == probeDelivery {
		if pr, ok := ctx.Value(probeKey).(*probe); ok {
			return p.runProbe(ctx, pr, d, next)
		}
	}
	tel := p.telemetryFor(ctx)
	ex := &execution{policy: p, tel: tel, attrs: tel.ForQueue(Queue(ctx))}
	if p.maxElapsed > 0 {
		ex.start = p.clock.Now()
	}
	attempt := 1
	for {
		actx, span := ex.startAttempt(ctx, attempt)
		err := next(actx, d)
		if err == nil {
			outcome := outcomeSucceeded
			if ex.recovered {
				outcome = outcomeRecovered
			}
			ex.endAttempt(ctx, span, outcome, nil)
			return nil
		}
		span = ex.failedFirst(ctx, attempt, span)
		if errors.Is(err, ErrInterrupted) {
			ex.endAttempt(ctx, span, outcomeInterrupted, err)
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			ex.endAttempt(ctx, span, outcomeInterrupted, err)
			return &InterruptedError{Attempt: attempt, Reason: cerr, Last: err}
		}
		dec := ex.decide(attempt, err)
		if !dec.retry {
			ex.endAttempt(ctx, span, dec.outcome(), err)
			return dec.finalError(attempt, err)
		}
		if span.IsRecording() {
			span.AddEvent("retry scheduled", trace.WithAttributes(attribute.Float64(AttrRetryDelay, dec.delay.Seconds())))
		}
		ex.endAttempt(ctx, span, outcomeRetrying, err)
		tel.Retries.Add(ctx, 1, ex.attrs.Queue.Add...)
		if p.onRetry != nil {
			p.onRetry(ctx, RetryEvent{Delivery: d, Attempt: attempt, Err: err, Delay: dec.delay})
		}
		Park(ctx)
		tel.Parked.Add(ctx, 1, ex.attrs.Queue.Add...)
		werr := p.clock.Wait(ctx, interruptFrom(ctx), dec.delay)
		tel.Parked.Add(ctx, -1, ex.attrs.Queue.Add...)
		if werr != nil {
			return &InterruptedError{Attempt: attempt, Reason: werr, Last: err}
		}
		attempt++
	}
}

// Span attribute and outcome names of the attempt spans and the
// amqpretry.attempts metric.
const (
	AttrAttempt    = "amqpretry.attempt"     // the attempt's number, 1-based
	AttrOutcome    = "amqpretry.outcome"     // how the attempt ended
	AttrRetryDelay = "amqpretry.retry.delay" // seconds until the next attempt, on the "retry scheduled" event

	outcomeSucceeded    = telemetry.OutcomeSucceeded
	outcomeRetrying     = telemetry.OutcomeRetrying
	outcomeExhausted    = telemetry.OutcomeExhausted
	outcomePermanent    = telemetry.OutcomePermanent
	outcomeNotRetryable = telemetry.OutcomeNotRetryable
	outcomeTimeLimited  = telemetry.OutcomeTimeLimited
	outcomeHandedOff    = telemetry.OutcomeHandedOff
	outcomeInterrupted  = telemetry.OutcomeInterrupted
	outcomeRecovered    = telemetry.OutcomeRecovered
)

func (d decision) outcome() string {
	switch d.stop {
	case stopPermanent:
		return outcomePermanent
	case stopNotRetryable:
		return outcomeNotRetryable
	case stopTimeLimit:
		return outcomeTimeLimited
	case stopHandOff:
		return outcomeHandedOff
	}
	return outcomeExhausted
}

// startAttempt opens the attempt's span and the context the chain below
// sees. Attempts are traced as children of a recording span (the listener's
// process span): under an unsampled parent they would be dropped anyway, and
// a root span per attempt is rarely wanted, so untraced deliveries pay
// nothing for tracing.
//
// The first attempt gets no span while it runs: most deliveries succeed at
// once, and for them the process span is the attempt (a second span would
// cost about 5% of throughput for nothing). If it fails, failedFirst records
// its span then, with its true start time, so a retried delivery shows one
// child span per attempt; spans the handler opened during that first attempt
// hang under the process span.
func (ex *execution) startAttempt(ctx context.Context, n int) (*attemptContext, trace.Span) {
	span := trace.SpanFromContext(ctx) // not recording: End and the rest do nothing
	sctx := ctx
	switch {
	case !span.IsRecording():
	case n == 1:
		ex.firstStart = time.Now()
		span = noSpan
	default:
		sctx, span = ex.tel.Tracer.Start(ctx, "attempt", trace.WithAttributes(attribute.Int(AttrAttempt, n)))
	}
	if n == 1 {
		ex.first = attemptContext{Context: sctx, exec: ex, attempt: 1}
		return &ex.first, span
	}
	return &attemptContext{Context: sctx, exec: ex, attempt: n}, span
}

// noSpan is a span that records nothing.
var noSpan = trace.SpanFromContext(context.Background())

// failedFirst records the span of a first attempt that failed, from its
// start; other attempts keep the span they have.
func (ex *execution) failedFirst(ctx context.Context, n int, span trace.Span) trace.Span {
	if n != 1 || ex.firstStart.IsZero() {
		return span
	}
	_, span = ex.tel.Tracer.Start(ctx, "attempt", trace.WithTimestamp(ex.firstStart), trace.WithAttributes(attribute.Int(AttrAttempt, 1)))
	return span
}

func (ex *execution) endAttempt(ctx context.Context, span trace.Span, outcome string, err error) {
	if span.IsRecording() { // ours: startAttempt only starts spans that record
		span.SetAttributes(attribute.String(AttrOutcome, outcome))
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(semconv.ErrorTypeKey.String(ErrorType(err)))
		}
		span.End()
	}
	ex.tel.Attempts.Add(ctx, 1, ex.attrs.Outcome(outcome).Add...)
}

func interruptFrom(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(interruptKey).(<-chan struct{})
	return ch // a nil channel never fires in a select
}

// attemptContext carries the attempt number and the delivery's execution to
// the middlewares and handler below Retry. One struct instead of
// context.WithValue keeps the success path to a single allocation.
type attemptContext struct {
	context.Context
	exec    *execution
	attempt int
}

func (c *attemptContext) Value(key any) any {
	switch {
	case key == attemptKey:
		return c
	case key == telemetry.ContextKey() && c.exec.policy.tel != nil:
		return c.exec.tel // Retry's own providers reach the middlewares below it
	}
	return c.Context.Value(key)
}

// execution is one delivery's pass through a Retry: it is never shared between
// deliveries, so its backoff state needs no lock.
type execution struct {
	policy     *retryPolicy
	tel        *telemetry.Telemetry
	attrs      *telemetry.QueueAttrs
	firstStart time.Time // when a traced first attempt began
	recovered  bool      // a Recover below handed the delivery to its recoverer
	first      attemptContext
	start      time.Time
	backoff    *backoff.ExponentialBackOff // created on the first failure
	decidedFor int                         // the attempt whose decision is cached
	decision   decision
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

type decision struct {
	retry bool
	delay time.Duration
	stop  stopReason
}

func (d decision) finalError(attempt int, err error) error {
	switch d.stop {
	case stopAttempts:
		return &RetriesExhaustedError{Attempts: attempt, Last: err}
	case stopTimeLimit:
		return &RetriesExhaustedError{Attempts: attempt, Last: err, TimeLimited: true}
	case stopHandOff:
		return &RetriesExhaustedError{Attempts: attempt, Last: err, HandedOff: true}
	default: // permanent or not retryable: the caller's error, with the count attached
		return &stoppedError{attempts: attempt, err: err}
	}
}

// stoppedError is the handler's error as Retry returns it when it stops
// early: it reads and unwraps as that error, and carries the attempt count
// for Attempts, so that a Recover outside Retry can tell how many were made.
type stoppedError struct {
	attempts int
	err      error
}

func (e *stoppedError) Error() string { return e.err.Error() }
func (e *stoppedError) Unwrap() error { return e.err }

// Attempts reports how many attempts the Retry that returned err made, when
// err came out of a Retry (exhausted, or stopped by a Permanent error or
// RetryIf).
func Attempts(err error) (int, bool) {
	var ex *RetriesExhaustedError
	if errors.As(err, &ex) {
		return ex.Attempts, true
	}
	var st *stoppedError
	if errors.As(err, &st) {
		return st.attempts, true
	}
	return 0, false
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
	switch {
	case IsPermanent(err):
		dec.stop = stopPermanent
	case p.retryIf != nil && !p.retryIf(err):
		dec.stop = stopNotRetryable
	case attempt >= p.maxAttempts:
		dec.stop = stopAttempts
	default:
		delay := ex.nextDelay()
		switch {
		case p.handOffSet && delay > p.handOff:
			dec.stop = stopHandOff
		case p.maxElapsed > 0 && p.clock.Now().Sub(ex.start)+delay > p.maxElapsed:
			dec.stop = stopTimeLimit
		default:
			dec.retry, dec.delay = true, delay
		}
	}
	ex.decidedFor, ex.decision = attempt, dec
	return dec
}

func (ex *execution) nextDelay() time.Duration {
	if ex.backoff == nil {
		p := ex.policy
		ex.backoff = &backoff.ExponentialBackOff{
			InitialInterval:     p.initial,
			RandomizationFactor: p.jitter,
			Multiplier:          p.multiplier,
			MaxInterval:         p.maxInterval,
			MaxElapsedTime:      0, // we enforce our own limit; backoff/v4 would stop at 15 minutes
			Stop:                backoff.Stop,
			Clock:               p.clock,
		}
		ex.backoff.Reset()
	}
	return ex.backoff.NextBackOff()
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
	// An interrupt or cancellation that has already happened wins over a
	// timer that is also ready.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-interrupt:
		return errInterruptSignalled
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-interrupt:
		return errInterruptSignalled
	}
}

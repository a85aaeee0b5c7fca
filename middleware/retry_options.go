package middleware

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"
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
	Rule     string        // the rule whose schedule applies (RuleApplied); "" when Retry has none
}

// RetryOption configures Retry. Options are applied to a copy of the
// defaults; Retry panics if any is invalid, naming each invalid option and
// its value.
type RetryOption func(*retryOptions)

// retryOptions is what the options set, before Retry checks it and builds
// its policy. Its schedule is the one of errors no rule matches.
type retryOptions struct {
	schedule
	retryIf   func(error) bool
	onRetry   func(context.Context, RetryEvent)
	clock     clock
	telemetry telemetry.Config // Retry's own providers; nil fields: the listener's
	rules     []retryRule      // RetryOn and NoRetryOn, in the order given
	errs      []error          // from options whose argument alone is wrong
}

// schedule is how many attempts a delivery gets and how long it waits
// between them: Retry's own, or a rule's.
type schedule struct {
	maxAttempts int
	initial     time.Duration
	multiplier  float64
	maxInterval time.Duration
	jitter      float64
	maxElapsed  time.Duration
	handOff     time.Duration
	handOffSet  bool
}

func defaultSchedule(maxAttempts int) schedule {
	return schedule{
		maxAttempts: maxAttempts,
		initial:     DefaultInitialInterval,
		multiplier:  DefaultMultiplier,
		maxInterval: DefaultMaxInterval,
	}
}

func defaultRetryOptions(maxAttempts int) retryOptions {
	return retryOptions{schedule: defaultSchedule(maxAttempts), clock: systemClock{}}
}

// WithInitialInterval sets the wait after the first failed attempt (Spring's
// initialInterval). Default 1s.
func WithInitialInterval(d time.Duration) RetryOption {
	return func(o *retryOptions) { o.initial = d }
}

// WithMultiplier sets the factor by which each wait grows (Spring's
// multiplier); 1 gives a constant wait. Default 2.
func WithMultiplier(m float64) RetryOption {
	return func(o *retryOptions) { o.multiplier = m }
}

// WithMaxInterval caps a single wait (Spring's maxInterval). Default 10s.
func WithMaxInterval(d time.Duration) RetryOption {
	return func(o *retryOptions) { o.maxInterval = d }
}

// WithJitter randomises each wait by ±factor (0 ≤ factor ≤ 1) so that many
// consumers failing together do not retry in lockstep. Default 0.
func WithJitter(factor float64) RetryOption {
	return func(o *retryOptions) { o.jitter = factor }
}

// WithMaxElapsedTime bounds the time from the first attempt's start: Retry
// does not begin a wait that would end after it. Default 0, no limit (unlike
// backoff/v4, whose default of 15 minutes would silently cap long policies).
func WithMaxElapsedTime(d time.Duration) RetryOption {
	return func(o *retryOptions) { o.maxElapsed = d }
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
	return func(o *retryOptions) { o.handOff, o.handOffSet = threshold, true }
}

// WithTracerProvider sets where Retry's attempt spans go. Without it, the
// tracer provider comes from the listener Retry runs in (whatever Retry's
// meter provider is), else from the global one.
func WithTracerProvider(tp trace.TracerProvider) RetryOption {
	return func(o *retryOptions) { o.telemetry.TracerProvider = tp }
}

// WithMeterProvider sets where Retry's metrics (amqpretry.attempts,
// amqpretry.retries, amqpretry.deliveries.parked), and those of a Recover
// inside it, go. Without it, the meter provider comes from the listener
// Retry runs in (whatever Retry's tracer provider is), else from the global
// one.
func WithMeterProvider(mp metric.MeterProvider) RetryOption {
	return func(o *retryOptions) { o.telemetry.MeterProvider = mp }
}

// RetryIf retries only errors for which retryable returns true; the others are
// returned at once, unchanged (and recovered by Recover). Permanent errors are
// never retried, whatever retryable says.
func RetryIf(retryable func(error) bool) RetryOption {
	return func(o *retryOptions) {
		if retryable == nil {
			o.errs = append(o.errs, errors.New("middleware: RetryIf expects a non-nil function"))
		}
		o.retryIf = retryable
	}
}

// OnRetry calls hook after a failed attempt, before Retry waits for the next
// one. It runs on the delivery's goroutine: keep it quick.
func OnRetry(hook func(ctx context.Context, e RetryEvent)) RetryOption {
	return func(o *retryOptions) {
		if hook == nil {
			o.errs = append(o.errs, errors.New("middleware: OnRetry expects a non-nil function"))
		}
		o.onRetry = hook
	}
}

// check returns every problem with maxAttempts and the options, each naming
// the option and its value.
func (o *retryOptions) check() []error {
	return append(o.schedule.check("Retry", "middleware: "), o.errs...)
}

// check returns every problem with the schedule of owner (Retry, or a rule),
// each naming the option and its value; the options' messages start with
// prefix.
func (o *schedule) check(owner, prefix string) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(prefix+format, args...)) }
	if o.maxAttempts < 1 {
		errs = append(errs, fmt.Errorf("middleware: %s expects maxAttempts >= 1, got %d", owner, o.maxAttempts))
	}
	if o.initial <= 0 {
		fail("WithInitialInterval expects a duration > 0, got %v", o.initial)
	}
	if math.IsNaN(o.multiplier) || math.IsInf(o.multiplier, 0) || o.multiplier < 1 {
		fail("WithMultiplier expects a finite factor >= 1, got %v", o.multiplier)
	}
	if o.maxInterval < o.initial {
		fail("WithMaxInterval expects a duration >= the initial interval %v, got %v", o.initial, o.maxInterval)
	}
	if math.IsNaN(o.jitter) || o.jitter < 0 || o.jitter > 1 {
		fail("WithJitter expects a factor between 0 and 1, got %v", o.jitter)
	}
	if o.maxElapsed < 0 {
		fail("WithMaxElapsedTime expects a duration >= 0 (0 means no limit), got %v", o.maxElapsed)
	}
	if o.handOffSet && o.handOff <= 0 {
		fail("HandOffAfter expects a duration > 0, got %v", o.handOff)
	}
	return errs
}

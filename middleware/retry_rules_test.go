package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

var (
	errTimeout    = errors.New("upstream timeout")
	errValidation = errors.New("invalid order")
	errFraud      = errors.New("fraud suspected")
)

// rateLimitedError is a failure type of the user's, matched with ErrorAs.
type rateLimitedError struct{ retryAfter time.Duration }

func (e *rateLimitedError) Error() string {
	return fmt.Sprintf("rate limited, retry after %v", e.retryAfter)
}

var (
	timeouts    = middleware.ErrorIs("timeout", errTimeout, context.DeadlineExceeded)
	rateLimited = middleware.ErrorAs[*rateLimitedError]("rate-limited")
	invalid     = middleware.ErrorIs("validation", errValidation)
	fraud       = middleware.ErrorFunc("fraud", func(err error) bool { return errors.Is(err, errFraud) })
)

// byErrorRetry is the policy of the issue: a timeout gets 5 quick attempts,
// a rate limit 4 slow ones, a validation error none, and the rest Retry's
// own 3.
func byErrorRetry(clock *middleware.FakeClock, opts ...middleware.RetryOption) middleware.Middleware {
	return middleware.Retry(3, append([]middleware.RetryOption{
		middleware.WithClock(clock),
		middleware.RetryOn(timeouts, 5, middleware.WithInitialInterval(100*time.Millisecond)),
		middleware.RetryOn(rateLimited, 4, middleware.WithInitialInterval(20*time.Second), middleware.WithMultiplier(1), middleware.WithMaxInterval(20*time.Second)),
		middleware.NoRetryOn(invalid),
	}, opts...)...)
}

func TestRetryByErrorClass(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name        string
		err         error
		wantCalls   int
		wantWaits   []time.Duration
		wantRule    string
		wantExhaust bool
	}{
		{"timeout: five quick attempts", errTimeout, 5, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms}, "timeout", true},
		{"a second target of the class", fmt.Errorf("query: %w", context.DeadlineExceeded), 5, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms}, "timeout", true},
		{"a type, found through wrapping", fmt.Errorf("call: %w", &rateLimitedError{time.Minute}), 4, []time.Duration{20 * time.Second, 20 * time.Second, 20 * time.Second}, "rate-limited", true},
		{"validation: not retried, returned unchanged", errValidation, 1, nil, "validation", false},
		{"the rest: Retry's own schedule", errBoom, 3, []time.Duration{time.Second, 2 * time.Second}, "default", true},
		{"Permanent wins over its class's schedule", middleware.Permanent(errTimeout), 1, nil, "timeout", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := middleware.NewFakeClock()
			var events []middleware.RetryEvent
			h := &failingHandler{failures: 1000, err: tt.err}
			err := byErrorRetry(clock, middleware.OnRetry(func(_ context.Context, e middleware.RetryEvent) { events = append(events, e) }))(h.Handle)(context.Background(), &amqp.Delivery{})
			if h.Calls() != tt.wantCalls {
				t.Errorf("%d calls, want %d", h.Calls(), tt.wantCalls)
			}
			if got := clock.Waits(); !slices.Equal(got, tt.wantWaits) {
				t.Errorf("waits = %v, want %v", got, tt.wantWaits)
			}
			if got := middleware.RuleApplied(context.Background(), err); got != tt.wantRule {
				t.Errorf("RuleApplied = %q, want %q", got, tt.wantRule)
			}
			var ex *middleware.RetriesExhaustedError
			if got := errors.As(err, &ex); got != tt.wantExhaust {
				t.Fatalf("err = %v: exhausted %v, want %v", err, got, tt.wantExhaust)
			}
			if tt.wantExhaust && (ex.Rule != tt.wantRule || ex.Attempts != tt.wantCalls) {
				t.Errorf("exhausted error %+v, want Rule %q after %d attempts", ex, tt.wantRule, tt.wantCalls)
			}
			if !tt.wantExhaust && (!errors.Is(err, tt.err) || err.Error() != tt.err.Error()) {
				t.Errorf("err = %v, want the handler's error, reading the same", err)
			}
			if n, _ := chainrun.AttemptsMade(err); n != tt.wantCalls {
				t.Errorf("AttemptsMade = %d, want %d", n, tt.wantCalls)
			}
			for _, e := range events {
				if e.Rule != tt.wantRule {
					t.Errorf("OnRetry told rule %q, want %q", e.Rule, tt.wantRule)
				}
			}
		})
	}
}

// When the error changes between attempts, the rule of the latest error
// decides; the attempt number is the delivery's, and each rule's waits move
// on with its own failures only.
func TestRetryRuleOfTheLatestErrorDecides(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name      string
		errs      []error // the attempts' errors, in order; the last repeats
		wantCalls int
		wantWaits []time.Duration
		wantRule  string
	}{
		{"timeout, rate limit, timeout, then the rest's limit is past",
			[]error{errTimeout, &rateLimitedError{}, errTimeout, errBoom}, 4,
			[]time.Duration{100 * ms, 20 * time.Second, 200 * ms}, "default"},
		{"the rest, then timeouts up to the timeout rule's five",
			[]error{errBoom, errBoom, errTimeout}, 5,
			[]time.Duration{time.Second, 2 * time.Second, 100 * ms, 200 * ms}, "timeout"},
		{"timeouts, then a validation error stops at once",
			[]error{errTimeout, errTimeout, errValidation}, 3,
			[]time.Duration{100 * ms, 200 * ms}, "validation"},
		{"a rate limit at attempt 4 is past its rule's 4 attempts",
			[]error{errTimeout, errTimeout, errTimeout, &rateLimitedError{}}, 4,
			[]time.Duration{100 * ms, 200 * ms, 400 * ms}, "rate-limited"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := middleware.NewFakeClock()
			calls := 0
			h := func(context.Context, *amqp.Delivery) error {
				calls++
				return tt.errs[min(calls, len(tt.errs))-1]
			}
			err := byErrorRetry(clock)(h)(context.Background(), &amqp.Delivery{})
			if calls != tt.wantCalls {
				t.Errorf("%d calls, want %d (err %v)", calls, tt.wantCalls, err)
			}
			if got := clock.Waits(); !slices.Equal(got, tt.wantWaits) {
				t.Errorf("waits = %v, want %v", got, tt.wantWaits)
			}
			if got := middleware.RuleApplied(context.Background(), err); got != tt.wantRule {
				t.Errorf("RuleApplied = %q, want %q (err %v)", got, tt.wantRule, err)
			}
		})
	}
}

func TestRetryRulesFirstMatchWins(t *testing.T) {
	both := fmt.Errorf("%w and %w", errTimeout, errFraud)
	for _, tt := range []struct {
		name  string
		rules []middleware.RetryOption
		want  string
		calls int
	}{
		{"timeout first", []middleware.RetryOption{middleware.RetryOn(timeouts, 2), middleware.NoRetryOn(fraud)}, "timeout", 2},
		{"fraud first", []middleware.RetryOption{middleware.NoRetryOn(fraud), middleware.RetryOn(timeouts, 2)}, "fraud", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := &failingHandler{failures: 100, err: both}
			err := middleware.Retry(5, append(tt.rules, middleware.WithClock(middleware.NewFakeClock()))...)(h.Handle)(context.Background(), &amqp.Delivery{})
			if got := middleware.RuleApplied(context.Background(), err); got != tt.want || h.Calls() != tt.calls {
				t.Errorf("rule %q after %d calls, want %q after %d", got, h.Calls(), tt.want, tt.calls)
			}
		})
	}
}

// RetryIf belongs to Retry's own schedule: it decides for the errors no
// rule matches, and a rule's errors are retried by the rule.
func TestRetryIfAppliesToTheRest(t *testing.T) {
	retry := middleware.Retry(5, middleware.WithClock(middleware.NewFakeClock()),
		middleware.RetryIf(func(error) bool { return false }),
		middleware.RetryOn(timeouts, 3))
	for _, tt := range []struct {
		err   error
		calls int
	}{{errTimeout, 3}, {errBoom, 1}} {
		h := &failingHandler{failures: 100, err: tt.err}
		_ = retry(h.Handle)(context.Background(), &amqp.Delivery{})
		if h.Calls() != tt.calls {
			t.Errorf("%v: %d calls, want %d", tt.err, h.Calls(), tt.calls)
		}
	}
}

// A rule's time limit counts from the delivery's first attempt.
func TestRetryRuleTimeLimit(t *testing.T) {
	clock := middleware.NewFakeClock()
	calls := 0
	h := func(context.Context, *amqp.Delivery) error {
		calls++
		if calls == 1 {
			return errBoom // waits Retry's 1s
		}
		return errTimeout
	}
	retry := middleware.Retry(3, middleware.WithClock(clock),
		middleware.RetryOn(timeouts, 10, middleware.WithInitialInterval(time.Second), middleware.WithMultiplier(1), middleware.WithMaxElapsedTime(2500*time.Millisecond)))
	err := retry(h)(context.Background(), &amqp.Delivery{})
	var ex *middleware.RetriesExhaustedError
	// 1s (the rest), then 1s (timeout): at 2s another 1s would pass 2.5s.
	if !errors.As(err, &ex) || !ex.TimeLimited || ex.Rule != "timeout" || calls != 3 {
		t.Fatalf("err = %v after %d calls, want a time-limited exhaustion under rule timeout after 3", err, calls)
	}
}

// Recover, inside Retry or around it, tells the recoverer and OnRecover
// which rule applied.
func TestRecoverSeesTheRule(t *testing.T) {
	for _, tt := range []struct {
		name  string
		chain func(middleware.Recoverer, middleware.RecoverOption) middleware.Middleware
	}{
		{"recover inside", func(r middleware.Recoverer, o middleware.RecoverOption) middleware.Middleware {
			return middleware.Chain(byErrorRetry(middleware.NewFakeClock()), middleware.Recover(r, o))
		}},
		{"recover outside", func(r middleware.Recoverer, o middleware.RecoverOption) middleware.Middleware {
			return middleware.Chain(middleware.Recover(r, o), byErrorRetry(middleware.NewFakeClock()))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for err, want := range map[error]string{errTimeout: "timeout", errValidation: "validation", errBoom: "default", middleware.Permanent(&rateLimitedError{}): "rate-limited"} {
				var seen, told string
				r := middleware.RecovererFunc(func(ctx context.Context, _ *amqp.Delivery, cause error) error {
					seen = middleware.RuleApplied(ctx, cause)
					return nil
				})
				hook := middleware.OnRecover(func(_ context.Context, e middleware.RecoverEvent) { told = e.Rule })
				if res := tt.chain(r, hook)(failing(err))(context.Background(), &amqp.Delivery{}); res != nil {
					t.Fatalf("%v: chain returned %v", err, res)
				}
				if seen != want || told != want {
					t.Errorf("%v: the recoverer saw rule %q and OnRecover %q, want %q", err, seen, told, want)
				}
			}
		})
	}
	// Without rules there is no rule to name.
	var seen = "unset"
	r := middleware.RecovererFunc(func(ctx context.Context, _ *amqp.Delivery, cause error) error {
		seen = middleware.RuleApplied(ctx, cause)
		return nil
	})
	_ = middleware.Chain(middleware.Retry(2, middleware.WithClock(middleware.NewFakeClock())), middleware.Recover(r))(failing(errBoom))(context.Background(), &amqp.Delivery{})
	if seen != "" {
		t.Errorf("a Retry without rules: RuleApplied = %q, want \"\"", seen)
	}
}

func failing(err error) middleware.Handler {
	return func(context.Context, *amqp.Delivery) error { return err }
}

// Each failed attempt's span names the rule that decided, and so does the
// recovery event.
func TestRetryRuleOnSpans(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	calls := 0
	h := func(context.Context, *amqp.Delivery) error {
		calls++
		if calls < 3 {
			return errTimeout
		}
		return errValidation
	}
	chain := middleware.Chain(byErrorRetry(middleware.NewFakeClock(), middleware.WithTracerProvider(tp)),
		middleware.Recover(middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })))
	ctx, process := tp.Tracer("test").Start(context.Background(), "process")
	if err := chain(h)(ctx, &amqp.Delivery{}); err != nil {
		t.Fatal(err)
	}
	process.End()
	var rules []string
	recoveryRule := ""
	for _, s := range spans.Ended() {
		if s.Name() != "attempt" {
			continue
		}
		rules = append(rules, attr(s.Attributes(), middleware.AttrRetryRule))
		for _, e := range s.Events() {
			if e.Name == "recovery" {
				recoveryRule = attr(e.Attributes, middleware.AttrRetryRule)
			}
		}
	}
	if want := []string{"timeout", "timeout", "validation"}; !slices.Equal(rules, want) {
		t.Errorf("attempt spans' %s = %q, want %q", middleware.AttrRetryRule, rules, want)
	}
	if recoveryRule != "validation" {
		t.Errorf("the recovery event's rule = %q, want validation", recoveryRule)
	}
}

func attr(attrs []attribute.KeyValue, key string) string {
	for _, a := range attrs {
		if string(a.Key) == key {
			return a.Value.AsString()
		}
	}
	return ""
}

func TestErrorClassMatches(t *testing.T) {
	type timeoutError interface {
		error
		Timeout() bool
	}
	netTimeouts := middleware.ErrorAs[timeoutError]("net-timeout")
	panicky := middleware.ErrorFunc("panicky", func(error) bool { panic("a bug in the predicate") })
	tests := []struct {
		class middleware.ErrorClass
		err   error
		want  bool
	}{
		{timeouts, errTimeout, true},
		{timeouts, fmt.Errorf("a: %w", errors.Join(errBoom, context.DeadlineExceeded)), true},
		{timeouts, errBoom, false},
		{timeouts, nil, false},
		{rateLimited, &rateLimitedError{}, true},
		{rateLimited, errBoom, false},
		{netTimeouts, fmt.Errorf("dial: %w", deadline{}), true},
		{netTimeouts, errBoom, false},
		{fraud, fmt.Errorf("check: %w", errFraud), true},
		{panicky, errBoom, false},
		{middleware.ErrorClass{}, errBoom, false},
	}
	for _, tt := range tests {
		if got := tt.class.Matches(tt.err); got != tt.want {
			t.Errorf("%q.Matches(%v) = %v, want %v", tt.class.Name(), tt.err, got, tt.want)
		}
	}
}

type deadline struct{}

func (deadline) Error() string   { return "i/o timeout" }
func (deadline) Timeout() bool   { return true }
func (deadline) Temporary() bool { return true }

func TestRetryRulesInvalid(t *testing.T) {
	tests := []struct {
		name  string
		build func()
		want  string
	}{
		{"zero class", func() { middleware.Retry(3, middleware.RetryOn(middleware.ErrorClass{}, 3)) },
			"middleware: RetryOn expects an ErrorClass made by ErrorIs, ErrorAs or ErrorFunc, got the zero ErrorClass"},
		{"two rules with one name", func() {
			middleware.Retry(3, middleware.RetryOn(timeouts, 3), middleware.NoRetryOn(middleware.ErrorIs("timeout", errBoom)))
		}, `middleware: NoRetryOn("timeout"): another rule of this Retry has the name "timeout"; the fault headers and spans name the rule that applied, so names must differ`},
		{"every bad schedule option, named with its rule", func() {
			middleware.Retry(3, middleware.RetryOn(timeouts, 0, middleware.WithJitter(2), middleware.WithInitialInterval(-1)))
		}, `middleware: RetryOn("timeout") expects maxAttempts >= 1, got 0` + "\n" +
			`middleware: RetryOn("timeout"): WithInitialInterval expects a duration > 0, got -1ns` + "\n" +
			`middleware: RetryOn("timeout"): WithJitter expects a factor between 0 and 1, got 2`},
		{"options that belong to Retry", func() {
			middleware.Retry(3, middleware.RetryOn(timeouts, 3, middleware.OnRetry(func(context.Context, middleware.RetryEvent) {}), middleware.NoRetryOn(invalid)))
		}, `middleware: RetryOn("timeout") takes schedule options only (WithInitialInterval, WithMultiplier, WithMaxInterval, WithJitter, WithMaxElapsedTime, HandOffAfter), got OnRetry, RetryOn or NoRetryOn: give it to Retry itself`},
		{"Retry's own problems first", func() { middleware.Retry(0, middleware.RetryOn(timeouts, 0)) },
			"middleware: Retry expects maxAttempts >= 1, got 0\n" + `middleware: RetryOn("timeout") expects maxAttempts >= 1, got 0`},
		{"ErrorIs without a name or targets", func() { middleware.ErrorIs("") },
			`middleware: ErrorIs("") expects a name (the fault headers and spans report it)` + "\n" + `middleware: ErrorIs("") expects at least one target error`},
		{"ErrorIs with a nil target", func() { middleware.ErrorIs("x", errBoom, nil) }, `middleware: ErrorIs("x") expects non-nil target errors, got nil at index 1`},
		{"the reserved name", func() { middleware.ErrorAs[*rateLimitedError]("default") },
			`middleware: ErrorAs("default") expects a name other than "default" (Retry's own schedule is called so)`},
		{"ErrorFunc without a function", func() { middleware.ErrorFunc("x", nil) }, `middleware: ErrorFunc("x") expects a non-nil function`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer expectPanic(t, tt.want)
			tt.build()
		})
	}
}

// A rule's HandOffAfter hands its errors to the recoverer when the rule's
// next wait is too long to hold; Retry's own errors keep their schedule.
func TestRetryRuleHandOff(t *testing.T) {
	clock := middleware.NewFakeClock()
	retry := middleware.Retry(3, middleware.WithClock(clock),
		middleware.RetryOn(rateLimited, 10, middleware.WithInitialInterval(time.Second), middleware.WithMaxInterval(time.Minute), middleware.HandOffAfter(5*time.Second)))
	h := &failingHandler{failures: 100, err: &rateLimitedError{}}
	err := retry(h.Handle)(context.Background(), &amqp.Delivery{})
	var ex *middleware.RetriesExhaustedError
	if !errors.As(err, &ex) || !ex.HandedOff || ex.Rule != "rate-limited" || h.Calls() != 4 {
		t.Fatalf("err = %v after %d calls, want a hand-off under rule rate-limited after 4 (waits 1s 2s 4s)", err, h.Calls())
	}
	h = &failingHandler{failures: 100, err: errBoom}
	if err := retry(h.Handle)(context.Background(), &amqp.Delivery{}); !errors.Is(err, middleware.ErrRetriesExhausted) || h.Calls() != 3 {
		t.Fatalf("the rest: err = %v after %d calls, want exhaustion after 3", err, h.Calls())
	}
}

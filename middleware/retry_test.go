package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

func TestRetryAttempts(t *testing.T) {
	tests := []struct {
		name         string
		maxAttempts  int
		failures     int
		err          error
		wantCalls    int
		wantErr      error // matched with errors.Is; nil means success
		wantExhaust  bool
		wantUnwrapTo error
	}{
		{"succeeds first time", 5, 0, errBoom, 1, nil, false, nil},
		{"succeeds on the last attempt", 5, 4, errBoom, 5, nil, false, nil},
		{"one attempt only", 1, 1, errBoom, 1, middleware.ErrRetriesExhausted, true, errBoom},
		{"exhausted after five", 5, 100, errBoom, 5, middleware.ErrRetriesExhausted, true, errBoom},
		{"permanent stops at once", 5, 100, middleware.Permanent(errBoom), 1, errBoom, false, errBoom},
		{"backoff.Permanent stops at once", 5, 100, backoff.Permanent(errBoom), 1, errBoom, false, errBoom},
		{"wrapped permanent stops at once", 5, 100, fmt.Errorf("decode: %w", middleware.Permanent(errBoom)), 1, errBoom, false, errBoom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &failingHandler{failures: tt.failures, err: tt.err}
			retry := middleware.Retry(tt.maxAttempts, middleware.WithClock(middleware.NewFakeClock()))
			err := retry(h.Handle)(context.Background(), &amqp.Delivery{})

			if got := h.Calls(); got != tt.wantCalls {
				t.Errorf("handler called %d times, want %d", got, tt.wantCalls)
			}
			if want := seq(1, tt.wantCalls); !slices.Equal(h.attempts, want) {
				t.Errorf("Attempt(ctx) per call = %v, want %v", h.attempts, want)
			}
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want it to match %v", err, tt.wantErr)
			}
			var ex *middleware.RetriesExhaustedError
			if got := errors.As(err, &ex); got != tt.wantExhaust {
				t.Fatalf("err = %v: RetriesExhaustedError found = %v, want %v", err, got, tt.wantExhaust)
			}
			if tt.wantExhaust && (ex.Attempts != tt.wantCalls || ex.Last != tt.err) {
				t.Errorf("exhausted error = %+v, want Attempts %d and Last %v", ex, tt.wantCalls, tt.err)
			}
			if !tt.wantExhaust && (!errors.Is(err, tt.err) || err.Error() != tt.err.Error()) {
				t.Errorf("err = %v, want the handler's error, reading the same", err)
			}
			if n, ok := chainrun.AttemptsMade(err); !ok || n != tt.wantCalls {
				t.Errorf("AttemptsMade(err) = %d, %v; want %d", n, ok, tt.wantCalls)
			}
		})
	}
}

func seq(from, to int) []int {
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func TestRetryDelays(t *testing.T) {
	s := time.Second
	tests := []struct {
		name        string
		maxAttempts int
		opts        []middleware.RetryOption
		want        []time.Duration
	}{
		{"Retry(5) waits 1s 2s 4s 8s", 5, nil, []time.Duration{1 * s, 2 * s, 4 * s, 8 * s}},
		{"default cap is 10s", 8, nil, []time.Duration{1 * s, 2 * s, 4 * s, 8 * s, 10 * s, 10 * s, 10 * s}},
		{"no wait with one attempt", 1, nil, nil},
		{"custom schedule", 5, []middleware.RetryOption{
			middleware.WithInitialInterval(100 * time.Millisecond),
			middleware.WithMultiplier(3),
			middleware.WithMaxInterval(time.Second),
		}, []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond, time.Second}},
		{"constant wait", 4, []middleware.RetryOption{
			middleware.WithInitialInterval(5 * s),
			middleware.WithMultiplier(1),
		}, []time.Duration{5 * s, 5 * s, 5 * s}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := middleware.NewFakeClock()
			var hooked []time.Duration
			opts := append([]middleware.RetryOption{
				middleware.WithClock(clock),
				middleware.OnRetry(func(_ context.Context, e middleware.RetryEvent) { hooked = append(hooked, e.Delay) }),
			}, tt.opts...)
			h := &failingHandler{failures: 1000, err: errBoom}
			_ = middleware.Retry(tt.maxAttempts, opts...)(h.Handle)(context.Background(), &amqp.Delivery{})
			if got := clock.Waits(); !slices.Equal(got, tt.want) {
				t.Errorf("waits = %v, want %v", got, tt.want)
			}
			if !slices.Equal(hooked, tt.want) {
				t.Errorf("OnRetry delays = %v, want %v", hooked, tt.want)
			}
		})
	}
}

// backoff/v4's ExponentialBackOff stops after 15 minutes by default; Retry
// must not inherit that limit.
func TestRetryHasNoElapsedLimitByDefault(t *testing.T) {
	clock := middleware.NewFakeClock()
	h := &failingHandler{failures: 1000, err: errBoom}
	err := middleware.Retry(200, middleware.WithClock(clock))(h.Handle)(context.Background(), &amqp.Delivery{})
	if h.Calls() != 200 {
		t.Fatalf("handler called %d times, want 200 (err %v)", h.Calls(), err)
	}
	var total time.Duration
	for _, w := range clock.Waits() {
		total += w
	}
	if total < 30*time.Minute {
		t.Fatalf("total wait %v: the test must run past backoff/v4's 15-minute default", total)
	}
}

func TestRetryMaxElapsedTime(t *testing.T) {
	clock := middleware.NewFakeClock()
	calls := 0
	slow := func(context.Context, *amqp.Delivery) error {
		calls++
		clock.Advance(100 * time.Millisecond) // each attempt takes 100ms
		return errBoom
	}
	// Attempt 1 ends at 0.1s, waits 1s; attempt 2 ends at 1.2s, waits 2s;
	// attempt 3 ends at 3.3s and a 4s wait would end at 7.3s > 5s: stop.
	err := middleware.Retry(10, middleware.WithClock(clock), middleware.WithMaxElapsedTime(5*time.Second))(slow)(context.Background(), &amqp.Delivery{})
	var ex *middleware.RetriesExhaustedError
	if !errors.As(err, &ex) || !ex.TimeLimited || ex.Attempts != 3 || calls != 3 {
		t.Fatalf("err = %v (%+v), calls = %d; want time-limited exhaustion after 3 attempts", err, ex, calls)
	}
}

func TestRetryJitter(t *testing.T) {
	clock := middleware.NewFakeClock()
	h := &failingHandler{failures: 1000, err: errBoom}
	_ = middleware.Retry(30,
		middleware.WithClock(clock),
		middleware.WithInitialInterval(time.Second),
		middleware.WithMultiplier(1),
		middleware.WithJitter(0.5),
	)(h.Handle)(context.Background(), &amqp.Delivery{})
	waits := clock.Waits()
	distinct := map[time.Duration]bool{}
	for _, w := range waits {
		if w < 500*time.Millisecond || w > 1500*time.Millisecond {
			t.Errorf("wait %v outside 1s ± 50%%", w)
		}
		distinct[w] = true
	}
	if len(distinct) < 10 {
		t.Errorf("%d distinct waits out of %d: jitter is not applied", len(distinct), len(waits))
	}
}

func TestHandOffAfter(t *testing.T) {
	clock := middleware.NewFakeClock()
	h := &failingHandler{failures: 100, err: errBoom}
	r := &recordingRecoverer{}
	err := middleware.Chain(middleware.Retry(10, middleware.WithClock(clock), middleware.HandOffAfter(5*time.Second)), middleware.Recover(r))(h.Handle)(context.Background(), &amqp.Delivery{})
	if err != nil || h.Calls() != 4 || r.Calls() != 1 {
		t.Fatalf("err %v, %d calls, %d recoveries; want 4 local attempts (waits 1s 2s 4s), then the recoverer", err, h.Calls(), r.Calls())
	}
	if got := clock.Waits(); !slices.Equal(got, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}) {
		t.Errorf("waits = %v", got)
	}
	h = &failingHandler{failures: 100, err: errBoom}
	err = middleware.Retry(10, middleware.WithClock(middleware.NewFakeClock()), middleware.HandOffAfter(5*time.Second))(h.Handle)(context.Background(), &amqp.Delivery{})
	var ex *middleware.RetriesExhaustedError
	if !errors.As(err, &ex) || !ex.HandedOff || ex.Attempts != 4 {
		t.Fatalf("err = %v, want a hand-off after 4 attempts", err)
	}
}

func TestRetryIf(t *testing.T) {
	errTransient := errors.New("transient")
	clock := middleware.NewFakeClock()
	retry := middleware.Retry(5, middleware.WithClock(clock),
		middleware.RetryIf(func(err error) bool { return errors.Is(err, errTransient) }))

	h := &failingHandler{failures: 1000, err: errBoom}
	if err := retry(h.Handle)(context.Background(), &amqp.Delivery{}); !errors.Is(err, errBoom) || err.Error() != "boom" || h.Calls() != 1 {
		t.Errorf("non-retryable: err = %v after %d calls, want errBoom after 1", err, h.Calls())
	}
	h = &failingHandler{failures: 1000, err: fmt.Errorf("wrapped: %w", errTransient)}
	if err := retry(h.Handle)(context.Background(), &amqp.Delivery{}); !errors.Is(err, middleware.ErrRetriesExhausted) || h.Calls() != 5 {
		t.Errorf("retryable: err = %v after %d calls, want exhaustion after 5", err, h.Calls())
	}
	h = &failingHandler{failures: 1000, err: middleware.Permanent(errTransient)}
	if _ = retry(h.Handle)(context.Background(), &amqp.Delivery{}); h.Calls() != 1 {
		t.Errorf("permanent but retryable by the predicate: %d calls, want 1: Permanent wins", h.Calls())
	}
}

func TestRetryOnRetryEvents(t *testing.T) {
	var events []middleware.RetryEvent
	d := &amqp.Delivery{MessageId: "m1"}
	h := &failingHandler{failures: 2, err: errBoom}
	err := middleware.Retry(5, middleware.WithClock(middleware.NewFakeClock()),
		middleware.OnRetry(func(_ context.Context, e middleware.RetryEvent) { events = append(events, e) }),
	)(h.Handle)(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	want := []middleware.RetryEvent{
		{Delivery: d, Attempt: 1, Err: errBoom, Delay: time.Second},
		{Delivery: d, Attempt: 2, Err: errBoom, Delay: 2 * time.Second},
	}
	if !slices.Equal(events, want) {
		t.Errorf("events = %+v, want %+v", events, want)
	}
}

func TestRetryCancelEndsWaitAtOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := &failingHandler{failures: 1000, err: errBoom}
	done := make(chan error, 1)
	go func() {
		done <- middleware.Retry(5, middleware.WithInitialInterval(time.Hour), middleware.WithMaxInterval(time.Hour))(h.Handle)(ctx, &amqp.Delivery{})
	}()
	time.Sleep(20 * time.Millisecond) // let it start waiting
	cancel()
	select {
	case err := <-done:
		var ie *middleware.InterruptedError
		if !errors.As(err, &ie) || !errors.Is(err, context.Canceled) || !errors.Is(err, errBoom) || ie.Attempt != 1 {
			t.Fatalf("err = %v, want an InterruptedError after attempt 1 matching context.Canceled and the cause", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Retry kept waiting after its context was cancelled")
	}
	if h.Calls() != 1 {
		t.Errorf("handler called %d times, want 1", h.Calls())
	}
}

func TestRetryInterruptEndsWaitButNotHandlers(t *testing.T) {
	interrupt := make(chan struct{})
	ctx := chainctx.WithInterrupt(context.Background(), interrupt)
	h := &failingHandler{failures: 1000, err: errBoom}
	done := make(chan error, 1)
	go func() {
		done <- middleware.Retry(5, middleware.WithInitialInterval(time.Hour), middleware.WithMaxInterval(time.Hour))(h.Handle)(ctx, &amqp.Delivery{})
	}()
	time.Sleep(20 * time.Millisecond)
	close(interrupt)
	select {
	case err := <-done:
		if !errors.Is(err, middleware.ErrInterrupted) || errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want ErrInterrupted without a context error", err)
		}
		if ctx.Err() != nil {
			t.Fatal("the interrupt must not cancel the handlers' context")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Retry kept waiting after the interrupt")
	}
}

func TestRetryStopsWhenHandlerSeesCancellation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	h := func(ctx context.Context, _ *amqp.Delivery) error {
		calls++
		cancel() // e.g. shutdown arrives while the handler runs
		return fmt.Errorf("query: %w", ctx.Err())
	}
	err := middleware.Retry(5, middleware.WithClock(middleware.NewFakeClock()))(h)(ctx, &amqp.Delivery{})
	if !errors.Is(err, middleware.ErrInterrupted) || calls != 1 {
		t.Fatalf("err = %v after %d calls, want ErrInterrupted after 1", err, calls)
	}
}

func TestRetryStatePerDelivery(t *testing.T) {
	// One Retry serves many deliveries at once; each must see its own
	// schedule 1s, 2s, 4s (run with -race).
	var mu sync.Mutex
	delays := map[*amqp.Delivery][]time.Duration{}
	retry := middleware.Retry(4, middleware.WithClock(middleware.NewFakeClock()),
		middleware.OnRetry(func(_ context.Context, e middleware.RetryEvent) {
			mu.Lock()
			defer mu.Unlock()
			delays[e.Delivery] = append(delays[e.Delivery], e.Delay)
		}))
	h := retry(func(context.Context, *amqp.Delivery) error { return errBoom })
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = h(context.Background(), &amqp.Delivery{})
		}()
	}
	wg.Wait()
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
	if len(delays) != 50 {
		t.Fatalf("%d deliveries seen, want 50", len(delays))
	}
	for d, got := range delays {
		if !slices.Equal(got, want) {
			t.Fatalf("delivery %p waited %v, want %v", d, got, want)
		}
	}
}

func TestAttemptsAfterAnEarlyStop(t *testing.T) {
	h := &failingHandler{failures: 2, err: errBoom}
	permanentOnThird := func(ctx context.Context, d *amqp.Delivery) error {
		if err := h.Handle(ctx, d); err != nil {
			return err
		}
		return middleware.Permanent(errBoom)
	}
	err := middleware.Retry(5, middleware.WithClock(middleware.NewFakeClock()))(permanentOnThird)(context.Background(), &amqp.Delivery{})
	if n, ok := chainrun.AttemptsMade(err); !ok || n != 3 || !middleware.IsPermanent(err) {
		t.Fatalf("Attempts = %d, %v (err %v); want 3 attempts and the error still permanent", n, ok, err)
	}
	if _, ok := chainrun.AttemptsMade(errBoom); ok {
		t.Error("Attempts found a count in an error that never went through Retry")
	}
}

func TestAttemptOutsideRetry(t *testing.T) {
	if got := middleware.Attempt(context.Background()); got != 1 {
		t.Fatalf("Attempt outside Retry = %d, want 1", got)
	}
}

func TestRetryInvalidArguments(t *testing.T) {
	tests := []struct {
		name string
		max  int
		opts []middleware.RetryOption
		want string
	}{
		{"zero attempts", 0, nil, "middleware: Retry expects maxAttempts >= 1, got 0"},
		{"negative attempts", -3, nil, "middleware: Retry expects maxAttempts >= 1, got -3"},
		{"zero initial", 3, []middleware.RetryOption{middleware.WithInitialInterval(0)},
			"middleware: WithInitialInterval expects a duration > 0, got 0s"},
		{"multiplier below one", 3, []middleware.RetryOption{middleware.WithMultiplier(0.5)},
			"middleware: WithMultiplier expects a finite factor >= 1, got 0.5"},
		{"NaN multiplier", 3, []middleware.RetryOption{middleware.WithMultiplier(math.NaN())},
			"middleware: WithMultiplier expects a finite factor >= 1, got NaN"},
		{"max below initial", 3, []middleware.RetryOption{middleware.WithInitialInterval(2 * time.Second), middleware.WithMaxInterval(time.Second)},
			"middleware: WithMaxInterval expects a duration >= the initial interval 2s, got 1s"},
		{"jitter above one", 3, []middleware.RetryOption{middleware.WithJitter(1.5)},
			"middleware: WithJitter expects a factor between 0 and 1, got 1.5"},
		{"negative elapsed limit", 3, []middleware.RetryOption{middleware.WithMaxElapsedTime(-time.Second)},
			"middleware: WithMaxElapsedTime expects a duration >= 0 (0 means no limit), got -1s"},
		{"nil predicate", 3, []middleware.RetryOption{middleware.RetryIf(nil)}, "middleware: RetryIf expects a non-nil function"},
		{"nil hook", 3, []middleware.RetryOption{middleware.OnRetry(nil)}, "middleware: OnRetry expects a non-nil function"},
		{"zero hand-off", 3, []middleware.RetryOption{middleware.HandOffAfter(0)}, "middleware: HandOffAfter expects a duration > 0, got 0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer expectPanic(t, tt.want)
			middleware.Retry(tt.max, tt.opts...)
		})
	}
}

// Several mistakes are named together, not one per run: the checks of the
// arguments first, then the options whose argument alone is wrong.
func TestRetryNamesEveryInvalidArgument(t *testing.T) {
	defer expectPanic(t, "middleware: Retry expects maxAttempts >= 1, got 0\n"+
		"middleware: WithJitter expects a factor between 0 and 1, got 1.5\n"+
		"middleware: RetryIf expects a non-nil function")
	middleware.Retry(0, middleware.RetryIf(nil), middleware.WithJitter(1.5))
}

// The default schedule in real time: Retry(6) waits 1s, 2s, 4s, 8s, 10s.
func TestRetryDefaultScheduleRealTime(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 25 s of real time")
	}
	t.Parallel()
	var starts []time.Time
	h := func(context.Context, *amqp.Delivery) error {
		starts = append(starts, time.Now())
		return errBoom
	}
	err := middleware.Retry(6)(h)(context.Background(), &amqp.Delivery{})
	if !errors.Is(err, middleware.ErrRetriesExhausted) {
		t.Fatalf("err = %v", err)
	}
	want := []time.Duration{1 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second}
	if len(starts) != len(want)+1 {
		t.Fatalf("%d attempts, want %d", len(starts), len(want)+1)
	}
	// Never early (beyond 150 ms), and late by less than a second, which
	// still tells each wait from the next: on a loaded machine (make test
	// runs three lanes on two cores) a timer fires up to several hundred
	// milliseconds late.
	for i, w := range want {
		got := starts[i+1].Sub(starts[i])
		if got < w-150*time.Millisecond || got > w+time.Second {
			t.Errorf("wait before attempt %d = %v, want %v, 150 ms early to a second late at most", i+2, got, w)
		}
	}
}

package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

func TestRecoverWithRetry(t *testing.T) {
	errPublish := errors.New("publish not confirmed")
	fake := middleware.WithClock
	tests := []struct {
		name         string
		chain        func(r middleware.Recoverer) middleware.Middleware
		failures     int
		err          error
		recoverErr   error
		wantCalls    int
		wantRecovers []int // Attempt(ctx) seen by each Recover call
		wantResult   chainrun.Settlement
	}{
		{
			name: "retry outside: only the last attempt is recovered",
			chain: func(r middleware.Recoverer) middleware.Middleware {
				return middleware.Chain(middleware.Retry(3, fake(middleware.NewFakeClock())), middleware.Recover(r))
			},
			failures: 100, err: errBoom, wantCalls: 3, wantRecovers: []int{3}, wantResult: chainrun.Ack,
		},
		{
			name: "retry inside: the exhausted error is recovered once",
			chain: func(r middleware.Recoverer) middleware.Middleware {
				return middleware.Chain(middleware.Recover(r), middleware.Retry(3, fake(middleware.NewFakeClock())))
			},
			failures: 100, err: errBoom, wantCalls: 3, wantRecovers: []int{1}, wantResult: chainrun.Ack,
		},
		{
			name: "success after a retry is not recovered",
			chain: func(r middleware.Recoverer) middleware.Middleware {
				return middleware.Chain(middleware.Retry(3, fake(middleware.NewFakeClock())), middleware.Recover(r))
			},
			failures: 1, err: errBoom, wantCalls: 2, wantRecovers: nil, wantResult: chainrun.Ack,
		},
		{
			name: "permanent is recovered at once",
			chain: func(r middleware.Recoverer) middleware.Middleware {
				return middleware.Chain(middleware.Retry(5, fake(middleware.NewFakeClock())), middleware.Recover(r))
			},
			failures: 100, err: middleware.Permanent(errBoom), wantCalls: 1, wantRecovers: []int{1}, wantResult: chainrun.Ack,
		},
		{
			name: "non-retryable is recovered at once",
			chain: func(r middleware.Recoverer) middleware.Middleware {
				return middleware.Chain(middleware.Retry(5, fake(middleware.NewFakeClock()), middleware.RetryIf(func(error) bool { return false })), middleware.Recover(r))
			},
			failures: 100, err: errBoom, wantCalls: 1, wantRecovers: []int{1}, wantResult: chainrun.Ack,
		},
		{
			name:     "no retry: the first error is recovered",
			chain:    func(r middleware.Recoverer) middleware.Middleware { return middleware.Recover(r) },
			failures: 100, err: errBoom, wantCalls: 1, wantRecovers: []int{1}, wantResult: chainrun.Ack,
		},
		{
			name: "a failed recovery requeues, even of a permanent error",
			chain: func(r middleware.Recoverer) middleware.Middleware {
				return middleware.Chain(middleware.Retry(3, fake(middleware.NewFakeClock())), middleware.Recover(r))
			},
			failures: 100, err: middleware.Permanent(errBoom), recoverErr: errPublish, wantCalls: 1, wantRecovers: []int{1}, wantResult: chainrun.Requeue,
		},
		{
			name: "a failed recovery after exhaustion requeues and is not retried",
			chain: func(r middleware.Recoverer) middleware.Middleware {
				return middleware.Chain(middleware.Retry(3, fake(middleware.NewFakeClock())), middleware.Recover(r))
			},
			failures: 100, err: errBoom, recoverErr: errPublish, wantCalls: 3, wantRecovers: []int{3}, wantResult: chainrun.Requeue,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &failingHandler{failures: tt.failures, err: tt.err}
			r := &recordingRecoverer{err: tt.recoverErr}
			err := tt.chain(r)(h.Handle)(context.Background(), &amqp.Delivery{})
			if h.Calls() != tt.wantCalls {
				t.Errorf("handler called %d times, want %d", h.Calls(), tt.wantCalls)
			}
			if !slices.Equal(r.attempts, tt.wantRecovers) {
				t.Errorf("recoverer called at attempts %v, want %v", r.attempts, tt.wantRecovers)
			}
			for _, cause := range r.causes {
				if !errors.Is(cause, errBoom) {
					t.Errorf("recoverer got cause %v, want one wrapping errBoom", cause)
				}
			}
			if got := chainrun.SettlementFor(err); got != tt.wantResult {
				t.Errorf("chain returned %v, settled as %v, want %v", err, got, tt.wantResult)
			}
			if tt.recoverErr != nil && (!errors.Is(err, middleware.ErrRecoveryFailed) || !errors.Is(err, tt.recoverErr)) {
				t.Errorf("err = %v, want ErrRecoveryFailed wrapping the recoverer's error", err)
			}
		})
	}
}

func TestRecoverGetsExhaustedErrorFromInnerRetry(t *testing.T) {
	r := &recordingRecoverer{}
	h := &failingHandler{failures: 100, err: errBoom}
	_ = middleware.Chain(middleware.Recover(r), middleware.Retry(4, middleware.WithClock(middleware.NewFakeClock())))(h.Handle)(context.Background(), &amqp.Delivery{})
	var ex *middleware.RetriesExhaustedError
	if r.Calls() != 1 || !errors.As(r.causes[0], &ex) || ex.Attempts != 4 {
		t.Fatalf("recoverer causes = %v, want one RetriesExhaustedError with 4 attempts", r.causes)
	}
}

func TestRecoverNeverRecoversInterruptions(t *testing.T) {
	t.Run("context cancelled during a wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		r := &recordingRecoverer{}
		h := &failingHandler{failures: 100, err: errBoom}
		chain := middleware.Chain(
			middleware.Recover(r), // outside too: it must not recover Retry's interruption
			middleware.Retry(5, middleware.WithInitialInterval(time.Hour), middleware.WithMaxInterval(time.Hour)),
			middleware.Recover(r),
		)
		done := make(chan error, 1)
		go func() { done <- chain(h.Handle)(ctx, &amqp.Delivery{}) }()
		time.Sleep(20 * time.Millisecond)
		cancel()
		err := <-done
		if r.Calls() != 0 || chainrun.SettlementFor(err) != chainrun.Release || !errors.Is(err, middleware.ErrInterrupted) {
			t.Fatalf("err = %v, %d recoveries; want an interruption, released (nack with requeue), never recovered", err, r.Calls())
		}
	})
	t.Run("interrupt during a wait", func(t *testing.T) {
		interrupt := make(chan struct{})
		r := &recordingRecoverer{}
		h := &failingHandler{failures: 100, err: errBoom}
		chain := middleware.Chain(middleware.Recover(r), middleware.Retry(5, middleware.WithInitialInterval(time.Hour), middleware.WithMaxInterval(time.Hour)), middleware.Recover(r))
		done := make(chan error, 1)
		go func() {
			done <- chain(h.Handle)(chainctx.WithInterrupt(context.Background(), interrupt), &amqp.Delivery{})
		}()
		time.Sleep(20 * time.Millisecond)
		close(interrupt)
		if err := <-done; r.Calls() != 0 || !errors.Is(err, middleware.ErrInterrupted) {
			t.Fatalf("err = %v, %d recoveries; want an interruption, never recovered", err, r.Calls())
		}
	})
	t.Run("last attempt fails because the context ended", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		r := &recordingRecoverer{}
		h := func(ctx context.Context, _ *amqp.Delivery) error { cancel(); return ctx.Err() }
		err := middleware.Recover(r)(h)(ctx, &amqp.Delivery{})
		if r.Calls() != 0 || !errors.Is(err, middleware.ErrInterrupted) {
			t.Fatalf("err = %v, %d recoveries; want an interruption, never recovered", err, r.Calls())
		}
	})
}

func TestRecovererAsksToReject(t *testing.T) {
	r := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error {
		return fmt.Errorf("queue has a DLX: %w", middleware.ErrReject)
	})
	h := &failingHandler{failures: 100, err: errBoom}
	err := middleware.Chain(middleware.Retry(2, middleware.WithClock(middleware.NewFakeClock())), middleware.Recover(r))(h.Handle)(context.Background(), &amqp.Delivery{})
	if chainrun.SettlementFor(err) != chainrun.Reject || !errors.Is(err, errBoom) || errors.Is(err, middleware.ErrRecoveryFailed) {
		t.Fatalf("err = %v, want a rejection that still shows the handler error", err)
	}
}

func TestQueueInContext(t *testing.T) {
	if q := chainctx.Queue(context.Background()); q != "" {
		t.Errorf("Queue without WithQueue = %q", q)
	}
	if q := chainctx.Queue(chainrun.WithQueue(context.Background(), "orders")); q != "orders" {
		t.Errorf("Queue = %q, want orders", q)
	}
}

func TestRecoverNilPanics(t *testing.T) {
	defer expectPanic(t, "middleware: Recover expects a non-nil Recoverer")
	middleware.Recover(nil)
}

func TestRecovererFunc(t *testing.T) {
	var got error
	r := middleware.RecovererFunc(func(_ context.Context, _ *amqp.Delivery, cause error) error { got = cause; return nil })
	if err := middleware.Recover(r)(func(context.Context, *amqp.Delivery) error { return errBoom })(context.Background(), &amqp.Delivery{}); err != nil || got != errBoom {
		t.Fatalf("err = %v, recovered %v", err, got)
	}
}

// Building a chain tells the listener's survey which Recoverer a Permanent
// error of the handler reaches: the innermost Recover's.
func TestRecoverReportsItsRecovererWhenBuilt(t *testing.T) {
	inner := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })
	outer := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })
	h := func(context.Context, *amqp.Delivery) error { t.Fatal("the survey ran the handler"); return nil }
	got := chainctx.SurveyChain(func() {
		middleware.Chain(middleware.Recover(outer), middleware.Retry(2), middleware.Recover(inner))(h)
	}).Recoverer
	if r, ok := got.(middleware.RecovererFunc); !ok || fmt.Sprintf("%p", r) != fmt.Sprintf("%p", inner) {
		t.Errorf("survey found %v, want the inner Recover's recoverer", got)
	}
}

type nilDerefError struct{ msg string }

func (e *nilDerefError) Error() string { return e.msg }

type panickyError struct{}

func (panickyError) Error() string { panic("boom") }

// A recoverer's ErrReject or ErrRedeliver comes back with the handler's
// error, formatted only when asked: it says and matches what
// fmt.Errorf("%w; handler error: %w") said and matched, even for errors whose
// Error methods panic.
func TestRecovererAnswerKeepsTheHandlerError(t *testing.T) {
	var typedNil *nilDerefError
	causes := []error{errBoom, middleware.Permanent(errBoom), &nilDerefError{"bad"}, typedNil, panickyError{}}
	answers := []error{middleware.ErrReject, fmt.Errorf("dlx says: %w", middleware.ErrRedeliver), middleware.ErrRedeliver}
	for _, answer := range answers {
		for _, cause := range causes {
			r := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return answer })
			err := middleware.Recover(r)(func(context.Context, *amqp.Delivery) error { return cause })(context.Background(), &amqp.Delivery{})
			want := fmt.Errorf("%w; handler error: %w", answer, cause)
			if err.Error() != want.Error() {
				t.Errorf("Error() = %q, want %q", err.Error(), want.Error())
			}
			for _, target := range []error{middleware.ErrReject, middleware.ErrRedeliver, middleware.ErrRecoveryFailed, errBoom, answer, cause} {
				if errors.Is(err, target) != errors.Is(want, target) {
					t.Errorf("%q: errors.Is(%v) = %v, want %v", want.Error(), target, errors.Is(err, target), errors.Is(want, target))
				}
			}
			var perm *middleware.PermanentError
			var nd *nilDerefError
			if errors.As(err, &perm) != errors.As(want, &perm) || errors.As(err, &nd) != errors.As(want, &nd) {
				t.Errorf("%q: errors.As differs from fmt.Errorf's", want.Error())
			}
			if chainrun.SettlementFor(err) != chainrun.SettlementFor(want) || middleware.IsPermanent(err) != middleware.IsPermanent(want) {
				t.Errorf("%q: settled %v, want %v", want.Error(), chainrun.SettlementFor(err), chainrun.SettlementFor(want))
			}
			if chainrun.ErrorType(err) != chainrun.ErrorType(want) || fmt.Sprint(chainrun.HandlerError(err)) != fmt.Sprint(chainrun.HandlerError(want)) {
				t.Errorf("%q: error type %q, handler error %v; want %q, %v", want.Error(),
					chainrun.ErrorType(err), chainrun.HandlerError(err), chainrun.ErrorType(want), chainrun.HandlerError(want))
			}
		}
	}
}

type waitCounter struct{ waits int }

func (w *waitCounter) WillWait() { w.waits++ }

// quickRecoverer answers at once when its delivery is not the last.
type quickRecoverer struct{ recovered int }

func (q *quickRecoverer) RecoversAtOnce(d *amqp.Delivery, _ error) bool { return !d.Redelivered }

func (q *quickRecoverer) Recover(_ context.Context, d *amqp.Delivery, _ error) error {
	q.recovered++
	if d.Redelivered {
		return nil
	}
	return middleware.ErrRedeliver
}

// A recoverer that says it answers at once does not make the listener hand
// its reading on to another goroutine; one that may wait does.
func TestRecoverTellsOfAWaitOnlyWhenTheRecovererMayWait(t *testing.T) {
	for _, tc := range []struct {
		name      string
		r         middleware.Recoverer
		redeliver bool
		waits     int
	}{
		{"answers at once", &quickRecoverer{}, false, 0},
		{"says it may wait", &quickRecoverer{}, true, 1},
		{"cannot say", middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil }), false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &waitCounter{}
			ctx := chainctx.WithWaitHook(context.Background(), w)
			middleware.Recover(tc.r)(func(context.Context, *amqp.Delivery) error { return errBoom })(ctx, &amqp.Delivery{Redelivered: tc.redeliver})
			if w.waits != tc.waits {
				t.Errorf("WillWait called %d times, want %d", w.waits, tc.waits)
			}
		})
	}
}

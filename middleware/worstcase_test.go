package middleware_test

import (
	"context"
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/middleware"
)

// worstCaseWait surveys mw as listener.New does: it builds the chain and
// runs none of it.
func worstCaseWait(mw middleware.Middleware) time.Duration {
	if mw == nil {
		return 0
	}
	return chainctx.SurveyWait(func() { mw(func(context.Context, *amqp.Delivery) error { return nil }) })
}

// Retry(5) may hold a delivery 15s; Retry(200), 32m45s, past RabbitMQ's
// default consumer_timeout of 30 minutes.
func TestWorstCaseWaitOfDefaultRetries(t *testing.T) {
	for _, tt := range []struct {
		attempts int
		want     string
	}{{5, "15s"}, {200, "32m45s"}} {
		if got := worstCaseWait(middleware.Retry(tt.attempts)).String(); got != tt.want {
			t.Errorf("worst case of Retry(%d) = %s, want %s", tt.attempts, got, tt.want)
		}
	}
}

func TestWorstCaseWait(t *testing.T) {
	s := time.Second
	r := &recordingRecoverer{}
	hooked := 0
	hook := middleware.OnRetry(func(context.Context, middleware.RetryEvent) { hooked++ })
	shortCircuit := func(middleware.Handler) middleware.Handler {
		return func(context.Context, *amqp.Delivery) error { return nil }
	}
	tests := []struct {
		name string
		mw   middleware.Middleware
		want time.Duration
	}{
		{"nil", nil, 0},
		{"empty chain", middleware.Chain(), 0},
		{"one attempt", middleware.Retry(1), 0},
		{"Retry(5) = 1+2+4+8", middleware.Retry(5, hook), 15 * s},
		{"capped at 10s", middleware.Retry(7), 35 * s},
		{"recover inside", middleware.Chain(middleware.Retry(5), middleware.Recover(r)), 15 * s},
		{"recover outside", middleware.Chain(middleware.Recover(r), middleware.Retry(5)), 15 * s},
		{"jitter counts at its largest", middleware.Retry(3, middleware.WithJitter(0.5)), 4500 * time.Millisecond},
		{"bounded by the elapsed limit", middleware.Retry(100, middleware.WithMaxElapsedTime(time.Minute)), time.Minute},
		{"nested retries multiply", middleware.Chain(middleware.Retry(2), middleware.Retry(3)), 1*s + 2*3*s},
		{"huge policies saturate", middleware.Retry(math.MaxInt, middleware.WithMaxInterval(time.Duration(math.MaxInt64/2))), math.MaxInt64},
		{"a middleware that never calls next hides no retry", middleware.Chain(shortCircuit, middleware.Retry(5)), 15 * s},
		{"nested through a middleware of the user's", middleware.Chain(middleware.Retry(2), shortCircuit, middleware.Retry(3)), 1*s + 2*3*s},
		{"a delivery copied on the way", middleware.Chain(copying, middleware.Retry(100, middleware.WithMaxInterval(10*time.Minute))), 89*10*time.Minute + 1023*s},
		{"constant waits, computed not looped", middleware.Retry(math.MaxInt32, middleware.WithMultiplier(1), middleware.WithInitialInterval(time.Millisecond)), time.Duration(math.MaxInt32-1) * time.Millisecond},
		{"growth that never reaches the cap", middleware.Retry(4, middleware.WithMultiplier(1.5), middleware.WithMaxInterval(time.Hour)), 1*s + 1500*time.Millisecond + 2250*time.Millisecond},
		{"hand-off: only waits up to the threshold", middleware.Retry(10, middleware.HandOffAfter(5*s)), 1*s + 2*s + 4*s},
		{"hand-off above the cap changes nothing", middleware.Retry(7, middleware.HandOffAfter(time.Hour)), 35 * s},
		{"hand-off with jitter: a draw up to the threshold", middleware.Retry(10, middleware.HandOffAfter(4500*time.Millisecond), middleware.WithJitter(0.5)), 1500*time.Millisecond + 3*s + 4500*time.Millisecond + 4500*time.Millisecond},
		{"initial at the cap", middleware.Retry(3, middleware.WithInitialInterval(5*s), middleware.WithMaxInterval(5*s)), 10 * s},
		{"rules: each schedule's worst case, one after the other", middleware.Retry(3,
			middleware.RetryOn(middleware.ErrorIs("a", errBoom), 5, middleware.WithInitialInterval(100*time.Millisecond)),
			middleware.NoRetryOn(middleware.ErrorIs("b", errBoom))), 1*s + 2*s + 1500*time.Millisecond},
		{"rules: no more waits than the delivery's attempts", middleware.Retry(2, middleware.WithMaxInterval(s),
			middleware.RetryOn(middleware.ErrorIs("a", errBoom), 2, middleware.WithMaxInterval(s)),
			middleware.RetryOn(middleware.ErrorIs("b", errBoom), 2, middleware.WithMaxInterval(s))), 1 * s},
		{"rules: a rule's attempts multiply the Retries inside", middleware.Chain(
			middleware.Retry(1, middleware.RetryOn(middleware.ErrorIs("a", errBoom), 3)), middleware.Retry(2)), 3*1*s + 1*s + 2*s},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := worstCaseWait(tt.mw); got != tt.want {
				t.Errorf("WorstCaseWait = %v, want %v", got, tt.want)
			}
		})
	}
	// The survey runs nothing: not the handler, not a middleware, not a
	// recoverer or a hook.
	called := 0
	validate := func(middleware.Handler) middleware.Handler {
		return func(context.Context, *amqp.Delivery) error { called++; return errBoom }
	}
	_ = worstCaseWait(middleware.Chain(middleware.Retry(3), middleware.Recover(r), validate))
	if r.Calls() != 0 || hooked != 0 || called != 0 {
		t.Errorf("the survey recovered %d, hooked %d and called a middleware %d times, want none", r.Calls(), hooked, called)
	}
}

// copying hands the next handler a copy of the delivery, as a decoding or
// decompressing step does.
func copying(next middleware.Handler) middleware.Handler {
	return func(ctx context.Context, d *amqp.Delivery) error {
		c := *d
		return next(ctx, &c)
	}
}

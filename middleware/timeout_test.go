package middleware_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

func TestTimeout(t *testing.T) {
	blockUntilDone := func(ctx context.Context, _ *amqp.Delivery) error { <-ctx.Done(); return ctx.Err() }
	ignore := func(context.Context, *amqp.Delivery) error { time.Sleep(30 * time.Millisecond); return nil }
	var calls int
	slowOnce := func(ctx context.Context, d *amqp.Delivery) error {
		if calls++; calls == 1 {
			return blockUntilDone(ctx, d)
		}
		return nil
	}
	failOnce := func(context.Context, *amqp.Delivery) error {
		if calls++; calls == 1 {
			return errBoom
		}
		return nil
	}
	tests := []struct {
		name        string
		mw          middleware.Middleware
		h           middleware.Handler
		wantTimeout bool
		wantIgnored bool
		settlement  chainrun.Settlement
		logged      bool
	}{
		{"in time", middleware.Timeout(time.Hour), func(context.Context, *amqp.Delivery) error { return nil }, false, false, chainrun.Ack, false},
		{"stops at the deadline", middleware.Timeout(5 * time.Millisecond), blockUntilDone, true, false, chainrun.Requeue, false},
		{"ignores the deadline", middleware.Timeout(5 * time.Millisecond), ignore, true, true, chainrun.Requeue, true},
		// The second attempt returns at once, but "in time" is by the clock:
		// a deadline of a few milliseconds can pass on a loaded machine before
		// the call even starts (ci16), so this one has half a second.
		{"retried inside Retry", middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(time.Millisecond)), middleware.Timeout(500*time.Millisecond)),
			slowOnce, false, false, chainrun.Ack, false},
		// Around a Retry the deadline cuts its wait: a timeout, a failure of
		// the message, never the release a shutdown gets.
		{"cuts a Retry's wait", middleware.Chain(middleware.Timeout(20*time.Millisecond), middleware.Retry(2, middleware.WithInitialInterval(time.Hour), middleware.WithMaxInterval(time.Hour))),
			failOnce, true, false, chainrun.Requeue, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls = 0
			var log testlog.Buffer
			ctx := chainctx.WithLogger(chainrun.WithQueue(context.Background(), "orders"), slog.New(slog.NewTextHandler(&log, nil)))
			err := tt.mw(tt.h)(ctx, &amqp.Delivery{MessageId: "m-1"})
			var te *middleware.TimeoutError
			if errors.As(err, &te) != tt.wantTimeout || errors.Is(err, middleware.ErrTimeout) != tt.wantTimeout {
				t.Fatalf("err = %v, want a timeout: %v", err, tt.wantTimeout)
			}
			if te != nil && te.Ignored != tt.wantIgnored {
				t.Errorf("Ignored = %v, want %v", te.Ignored, tt.wantIgnored)
			}
			if got := chainrun.SettlementFor(err); got != tt.settlement {
				t.Errorf("settlement %v, want %v (err %v)", got, tt.settlement, err)
			}
			logged := strings.Contains(log.String(), "ignored the deadline")
			if logged != tt.logged {
				t.Errorf("warning logged: %v, want %v:\n%s", logged, tt.logged, log.String())
			}
			if logged && (!strings.Contains(log.String(), "queue=orders") || !strings.Contains(log.String(), "message_id=m-1")) {
				t.Errorf("the warning does not name the queue and message: %s", log.String())
			}
		})
	}
}

// When the caller's context ends first (a shutdown), Timeout passes the
// result on unchanged: the listener releases the message.
func TestTimeoutLeavesTheCallersCancellationAlone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := middleware.Timeout(time.Hour)(func(ctx context.Context, _ *amqp.Delivery) error { return ctx.Err() })(ctx, &amqp.Delivery{})
	if !errors.Is(err, context.Canceled) || errors.Is(err, middleware.ErrTimeout) {
		t.Errorf("err = %v, want context.Canceled and no timeout", err)
	}
}

func TestTimeoutPanicsOnANonPositiveDuration(t *testing.T) {
	defer func() {
		if v := recover(); v == nil || !strings.Contains(v.(string), "Timeout expects a duration > 0, got 0s") {
			t.Errorf("panic %v", v)
		}
	}()
	middleware.Timeout(0)
}

// The listener's survey counts a Timeout as handler time: on every attempt
// of the Retry around it.
func TestTimeoutCountsTowardTheWorstCase(t *testing.T) {
	tests := []struct {
		name string
		mw   middleware.Middleware
		want time.Duration
	}{
		{"alone", middleware.Timeout(time.Minute), time.Minute},
		{"inside Retry(3)", middleware.Chain(middleware.Retry(3), middleware.Timeout(10*time.Second)), time.Second + 2*time.Second + 3*10*time.Second},
		{"around Retry(3): it bounds the waits", middleware.Chain(middleware.Timeout(2*time.Second), middleware.Retry(3)), 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := worstCaseWait(tt.mw); got != tt.want {
				t.Errorf("worst case %v, want %v", got, tt.want)
			}
		})
	}
}

package recoverer_test

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// waits counts the times a chain tells the listener that a delivery is
// about to wait (the listener then hands its reading to another goroutine).
type waits struct{ n int }

func (w *waits) WillWait() { w.n++ }

// Reject and Requeue answer at once, with no I/O: Recover does not tell the
// listener that the delivery will wait, so the reader goes on with it, and
// they answer as they always did. A Republish through a Publisher of your
// own may wait for its confirm, and says so.
func TestRejectAndRequeueAnswerWithoutAWait(t *testing.T) {
	failing := func(context.Context, *amqp.Delivery) error { return errors.New("boom") }
	for _, tc := range []struct {
		name  string
		r     middleware.Recoverer
		waits int
		is    error
	}{
		{"Reject", recoverer.Reject(), 0, middleware.ErrReject},
		{"Requeue", recoverer.Requeue(), 0, recoverer.ErrRequeueRequested},
		{"Republish", recoverer.Republish(frameOnly{}, "", "q.dlq"), 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &waits{}
			ctx := chainctx.WithWaitHook(chainctx.WithQueue(context.Background(), "q"), w)
			err := middleware.Recover(tc.r)(failing)(ctx, &amqp.Delivery{RoutingKey: "q"})
			if w.n != tc.waits {
				t.Errorf("WillWait called %d times, want %d", w.n, tc.waits)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("the chain returned %v, want one that matches %v", err, tc.is)
			}
		})
	}
}

// Reject's answer is made once, not per failure.
func TestRejectDoesNotAllocate(t *testing.T) {
	r, d, cause := recoverer.Reject(), &amqp.Delivery{}, errors.New("boom")
	if n := testing.AllocsPerRun(100, func() { _ = r.Recover(context.Background(), d, cause) }); n != 0 {
		t.Errorf("Reject's Recover allocates %v times, want 0", n)
	}
}

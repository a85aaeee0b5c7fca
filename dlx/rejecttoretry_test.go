package dlx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/pubtest"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/recoverer"
)

// xDeath is the x-death header the broker writes after count rejections of
// a message from queue.
func xDeath(queue, reason string, count int64) amqp.Table {
	return amqp.Table{"x-death": []any{amqp.Table{"queue": queue, "reason": reason, "count": count}}}
}

// How the listener settles a failed delivery in the single-delay layout,
// where the work queue dead-letters every rejection into its retry queue and
// back: a rejection is a retry, so what should leave the loop (the last
// retry, a Permanent error) must never be rejected, even when final asks for
// it (recoverer.Reject): that would loop forever.
func TestRejectToRetryNeverRejectsOutOfTheLoop(t *testing.T) {
	topo := dlx.Topology{Queue: "orders", SingleRetryDelay: time.Second}
	tests := []struct {
		name      string
		headers   amqp.Table
		cause     error
		final     func(*pubtest.Publisher) middleware.Recoverer
		want      chainrun.Settlement
		published bool
		says      []string
	}{
		{"a retry is a rejection", xDeath("orders", "rejected", 1), errors.New("down"), reject, chainrun.Reject, false,
			[]string{"retry 2 of 2 through orders.retry"}},
		{"retries used up, final rejects", xDeath("orders", "rejected", 2), errors.New("down"), reject, chainrun.Requeue, false,
			[]string{"orders dead-letters every rejection into orders.retry", "loop forever", "recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())",
				`exchange "orders.dlx" with key "orders"`, "recoverer: Reject"}},
		{"Permanent, final rejects", nil, middleware.Permanent(errors.New("invalid JSON")), reject, chainrun.Requeue, false,
			[]string{"loop forever", "recoverer.Republish"}},
		{"retries used up, final publishes", xDeath("orders", "rejected", 2), errors.New("down"), republish, chainrun.Ack, true, nil},
		{"Permanent, final publishes", nil, middleware.Permanent(errors.New("invalid JSON")), republish, chainrun.Ack, true, nil},
		{"retries used up, final requeues", xDeath("orders", "rejected", 2), errors.New("down"),
			func(*pubtest.Publisher) middleware.Recoverer { return recoverer.Requeue() }, chainrun.Requeue, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := &pubtest.Publisher{}
			chain := middleware.Recover(topo.RejectToRetry(2, tt.final(pub)))
			err := chain(func(context.Context, *amqp.Delivery) error { return tt.cause })(
				chainrun.WithQueue(context.Background(), topo.Queue), &amqp.Delivery{Headers: tt.headers})
			if got := chainrun.SettlementFor(err); got != tt.want {
				t.Errorf("settled with %v (error %v), want %v", got, err, tt.want)
			}
			if got := len(pub.Sent()) == 1; got != tt.published {
				t.Errorf("published %d messages, want published=%v", len(pub.Sent()), tt.published)
			}
			var retry interface{ RetriesThroughDeadLetters() bool }
			if got := errors.As(err, &retry) && retry.RetriesThroughDeadLetters(); got != (tt.want == chainrun.Reject) {
				t.Errorf("error %v: RetriesThroughDeadLetters %v, want it exactly on the retries, which the listener must not report as a loop", err, got)
			}
			for _, want := range tt.says {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("error %v; want it to say %q", err, want)
				}
			}
		})
	}
}

func reject(*pubtest.Publisher) middleware.Recoverer { return recoverer.Reject() }

func republish(pub *pubtest.Publisher) middleware.Recoverer {
	return recoverer.Republish(pub, "orders.dlx", "orders")
}

func TestRejectToRetryNamesEveryBadArgument(t *testing.T) {
	defer func() {
		got := fmt.Sprint(recover())
		for _, want := range []string{"RejectToRetry needs Topology.SingleRetryDelay", "maxRetries >= 0, got -1", "expects a final Recoverer"} {
			if !strings.Contains(got, want) {
				t.Errorf("RejectToRetry panicked with %q; want it to say %q", got, want)
			}
		}
	}()
	dlx.Topology{Queue: "orders"}.RejectToRetry(-1, nil)
}

func TestRejectedFrom(t *testing.T) {
	tests := []struct {
		name    string
		headers amqp.Table
		want    bool
	}{
		{"no x-death", nil, false},
		{"rejected from the queue", xDeath("orders", "rejected", 1), true},
		{"rejected, count unreadable", xDeath("orders", "rejected", -5), true},
		{"rejected from another queue", xDeath("payments", "rejected", 1), false},
		{"expired from the queue", xDeath("orders", "expired", 1), false},
		{"several entries", amqp.Table{"x-death": []any{
			amqp.Table{"queue": "orders.retry", "reason": "expired", "count": int64(3)},
			amqp.Table{"queue": "orders", "reason": "rejected", "count": int64(3)},
		}}, true},
		{"junk", amqp.Table{"x-death": "rejected from orders"}, false},
		{"junk entries", amqp.Table{"x-death": []any{"orders", amqp.Table{"queue": 7, "reason": "rejected"}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := dlx.RejectedFrom(&amqp.Delivery{Headers: tt.headers}, "orders"); got != tt.want {
				t.Errorf("RejectedFrom(%v, orders) = %v, want %v", tt.headers, got, tt.want)
			}
		})
	}
	if dlx.RejectedFrom(nil, "orders") {
		t.Error("RejectedFrom(nil) = true")
	}
}

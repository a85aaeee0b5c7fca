package dlx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/pubtest"
	"github.com/amqpretry/amqpretry/middleware"
)

// Where Tiers sends a failed message, by its retry count, without a broker:
// the next tier through the default exchange with the count raised, the
// DLQ (count kept) once the tiers are used up or for a Permanent error.
func TestTierRouting(t *testing.T) {
	topo := dlx.Topology{Queue: "orders", RetryDelays: []time.Duration{10 * time.Second, time.Minute}}
	tests := []struct {
		name      string
		count     any // x-retry-count, nil for none
		cause     error
		opts      []dlx.TierOption
		exchange  string
		key       string
		wantCount int64
	}{
		{"first failure", nil, errors.New("x"), nil, "", "orders.retry.10s", 1},
		{"second", int64(1), errors.New("x"), nil, "", "orders.retry.1m", 2},
		{"tiers used up", int64(2), errors.New("x"), nil, "orders.dlx", "orders", 2},
		{"permanent", nil, middleware.Permanent(errors.New("x")), nil, "orders.dlx", "orders", 0},
		{"more retries than tiers", int64(3), errors.New("x"), []dlx.TierOption{dlx.MaxRetries(5)}, "", "orders.retry.1m", 4},
		{"junk count", "three", errors.New("x"), nil, "", "orders.retry.10s", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := &pubtest.Publisher{}
			d := &amqp.Delivery{RoutingKey: "orders", Body: []byte("x")}
			if tt.count != nil {
				d.Headers = amqp.Table{dlx.RetryCountHeader: tt.count}
			}
			if err := topo.Tiers(pub, tt.opts...).Recover(context.Background(), d, tt.cause); err != nil {
				t.Fatal(err)
			}
			sent := pub.Sent()
			if len(sent) != 1 {
				t.Fatalf("published %d", len(sent))
			}
			got := sent[0]
			if got.Exchange != tt.exchange || got.Key != tt.key || got.Msg.Headers[dlx.RetryCountHeader] != tt.wantCount {
				t.Errorf("to %q with %q, %s=%v; want %q with %q, %d", got.Exchange, got.Key,
					dlx.RetryCountHeader, got.Msg.Headers[dlx.RetryCountHeader], tt.exchange, tt.key, tt.wantCount)
			}
		})
	}
}

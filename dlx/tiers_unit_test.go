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
	"github.com/amqpretry/amqpretry/recoverer"
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

func TestTierNextDelay(t *testing.T) {
	topo := dlx.Topology{Queue: "orders", RetryDelays: []time.Duration{time.Second, time.Minute}}
	pub := &pubtest.Publisher{}
	tests := []struct {
		name       string
		opts       []dlx.TierOption
		retryCount int64
		want       time.Duration // 0: the DLQ
	}{
		{"fresh message: first tier", nil, 0, time.Second},
		{"second retry: second tier", nil, 1, time.Minute},
		{"default limit is one retry per tier", nil, 2, 0},
		{"past the tiers: the last one again", []dlx.TierOption{dlx.MaxRetries(4)}, 3, time.Minute},
		{"at the limit: the DLQ", []dlx.TierOption{dlx.MaxRetries(4)}, 4, 0},
		{"MaxRetries(0): the DLQ at once", []dlx.TierOption{dlx.MaxRetries(0)}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &amqp.Delivery{Headers: amqp.Table{dlx.RetryCountHeader: tt.retryCount}}
			if got := topo.Tiers(pub, tt.opts...).NextDelay(d); got != tt.want {
				t.Errorf("NextDelay with retry-count %d = %v, want %v", tt.retryCount, got, tt.want)
			}
		})
	}
}

func TestMaxRetriesRejectsANegativeCount(t *testing.T) {
	topo := dlx.Topology{Queue: "orders", RetryDelays: []time.Duration{time.Second}}
	pub := &pubtest.Publisher{}
	defer func() {
		if r := recover(); !strings.Contains(fmt.Sprint(r), "MaxRetries expects n >= 0, got -1") {
			t.Errorf("Tiers with MaxRetries(-1) panicked with %v, want the option's name and value", r)
		}
	}()
	topo.Tiers(pub, dlx.MaxRetries(-1))
}

// Tiers names every problem at once: the topology's, its own options', and
// those of the republish options it passes on, with their values.
func TestTiersNamesEveryBadOption(t *testing.T) {
	defer func() {
		got := fmt.Sprint(recover())
		for _, want := range []string{"Topology.Queue is required", "Tiers needs Topology.RetryDelays", "MaxRetries expects n >= 0, got -2",
			"WithHeadroom expects 0 to 1048576 bytes, got -1", "WithPublishTimeout expects a duration > 0, got 0s", "non-nil *publisher.Publisher"} {
			if !strings.Contains(got, want) {
				t.Errorf("Tiers panicked with %q; want it to say %q", got, want)
			}
		}
	}()
	dlx.Topology{}.Tiers(nil, dlx.MaxRetries(-2),
		dlx.WithRepublishOptions(recoverer.WithHeadroom(-1), recoverer.WithPublishTimeout(0)))
}

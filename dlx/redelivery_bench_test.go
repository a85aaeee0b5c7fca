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
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// settledAcknowledger counts settlements and does no I/O.
type settledAcknowledger struct{ acks, nacks, rejects int }

func (a *settledAcknowledger) Ack(uint64, bool) error        { a.acks++; return nil }
func (a *settledAcknowledger) Nack(uint64, bool, bool) error { a.nacks++; return nil }
func (a *settledAcknowledger) Reject(uint64, bool) error     { a.rejects++; return nil }

// BenchmarkRedeliverFailure is what a failed delivery below its last costs
// the consumer on a DelayedRedelivery topology without the broker: the chain
// Recover(topo.Redeliver(pub)) run on a delivery and settled with
// basic.reject(requeue=true), as the listener does (bench's retry section,
// variant "delayed", less the channel).
func BenchmarkRedeliverFailure(b *testing.B) {
	topo := dlx.Topology{Queue: "orders", Type: dlx.Quorum,
		DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 20, Min: 50 * time.Millisecond, Max: 50 * time.Millisecond}}
	boom := errors.New("boom")
	h := middleware.Chain(middleware.Recover(topo.Redeliver(&pubtest.Publisher{})))(func(context.Context, *amqp.Delivery) error { return boom })
	ack := &settledAcknowledger{}
	d := redelivery(3, ack)
	ctx := chainrun.WithQueue(context.Background(), "orders")
	b.ReportAllocs()
	for b.Loop() {
		err := h(ctx, d)
		if s, serr := chainrun.Settle(d, err); s != chainrun.Requeue || serr != nil {
			b.Fatalf("settled %v (%v), want a requeue", s, serr)
		}
	}
	if ack.rejects == 0 || ack.acks+ack.nacks != 0 {
		b.Fatalf("settlements: %+v, want rejects only", *ack)
	}
}

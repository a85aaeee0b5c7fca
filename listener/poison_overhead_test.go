package listener

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// confirmedAtOnce is a recoverer.Publisher whose every publish is confirmed
// at once, so that a benchmark measures what is ours around the publish.
type confirmedAtOnce struct{}

func (confirmedAtOnce) Publish(context.Context, string, string, amqp.Publishing) error { return nil }
func (confirmedAtOnce) FrameMax() int                                                  { return 131072 }
func (confirmedAtOnce) Username() string                                               { return "guest" }

// BenchmarkPoisonOverhead is the listener's own cost for a message that fails
// for good and goes to the DLQ, with no broker in the way: one delivery
// through process with Chain(Retry(5), Recover(Republish)), the handler
// returning Permanent, the fault headers built, the copy "confirmed" at once
// and the original acked on a fake acknowledger. The publisher and amqp091's
// encoding of the copy are not in it; the poison section of make bench has
// them.
func BenchmarkPoisonOverhead(b *testing.B) {
	poison := errors.New("bench: poison message")
	handler := func(context.Context, *amqp.Delivery) error { return middleware.Permanent(poison) }
	chain := middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer.Republish(confirmedAtOnce{}, "", "q.dlq")))
	l, err := New("q", chain, handler, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		b.Fatal(err)
	}
	c := benchConsumer(b, l, handler)
	headers := amqp.Table{"tenant": "acme", "attempt-source": "web"}
	b.ReportAllocs()
	for b.Loop() {
		// Not the reader, so WillWait starts no reading goroutine: there is
		// no deliveries channel here.
		dd := &delivery{Delivery: amqp.Delivery{
			Acknowledger: nopAck{}, DeliveryTag: 1, Exchange: "orders", RoutingKey: "order.created",
			MessageId: "m-1", ContentType: "application/json", Headers: headers, Body: []byte(`{"order":1}`),
		}, c: c, received: monotime()}
		c.current.Store(dd)
		c.inFlight.Add(1)
		c.pending.Add(1)
		c.process(dd)
	}
	if got := l.stats.handled.Load(); got == 0 {
		b.Fatalf("no delivery was acked after its recovery")
	}
}

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
	b.ReportAllocs()
	for b.Loop() {
		// Not the reader, so WillWait starts no reading goroutine: there is
		// no deliveries channel here.
		c.process(poisonDelivery(c))
	}
	if got := l.stats.handled.Load(); got == 0 {
		b.Fatalf("no delivery was acked after its recovery")
	}
}

// asyncRecoverer is a middleware.AsyncRecoverer that puts every message
// away at once: done is called inside RecoverAsync, or, with later set, on
// the goroutine that serves later, as a confirm would come on the
// publisher's.
type asyncRecoverer struct{ later chan func(error) }

func (asyncRecoverer) Recover(context.Context, *amqp.Delivery, error) error { return nil }

func (r asyncRecoverer) RecoverAsync(_ context.Context, _ *amqp.Delivery, _ error, done func(error)) (bool, error) {
	if r.later == nil {
		done(nil)
	} else {
		r.later <- done
	}
	return true, nil
}

// BenchmarkPoisonDeferred is BenchmarkPoisonOverhead on the deferred path
// (DeferSettlement), which a synchronous publisher never takes: the
// recoverer is asynchronous and does nothing but answer, so what is
// measured is the listener's and the middleware's own cost of settling a
// failure later. at-once has the outcome come before the chain returns;
// later has it come on another goroutine after the chain has returned, and
// the original is acked there (settleLater).
func BenchmarkPoisonDeferred(b *testing.B) {
	poison := errors.New("bench: poison message")
	handler := func(context.Context, *amqp.Delivery) error { return middleware.Permanent(poison) }
	for _, tc := range []struct {
		name  string
		later bool
	}{{"at-once", false}, {"later", true}} {
		b.Run(tc.name, func(b *testing.B) {
			r := asyncRecoverer{}
			if tc.later {
				r.later = make(chan func(error))
				served := make(chan struct{})
				go func() {
					defer close(served)
					for done := range r.later {
						done(nil)
					}
				}()
				b.Cleanup(func() { close(r.later); <-served })
			}
			chain := middleware.Chain(middleware.Retry(5), middleware.Recover(r))
			l, err := New("q", chain, handler, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			if err != nil {
				b.Fatal(err)
			}
			c := benchConsumer(b, l, handler)
			b.ReportAllocs()
			for b.Loop() {
				c.process(poisonDelivery(c))
				c.pending.Wait() // settled, on whichever goroutine
			}
			if got := l.stats.handled.Load(); got == 0 {
				b.Fatalf("no delivery was acked after its recovery")
			}
		})
	}
}

// poisonHeaders are the headers of the poison benchmarks' deliveries.
var poisonHeaders = amqp.Table{"tenant": "acme", "attempt-source": "web"}

// poisonDelivery is a delivery of the poison benchmarks, taken in by c as
// its reader would.
func poisonDelivery(c *consumer) *delivery {
	dd := &delivery{Delivery: amqp.Delivery{
		Acknowledger: nopAck{}, DeliveryTag: 1, Exchange: "orders", RoutingKey: "order.created",
		MessageId: "m-1", ContentType: "application/json", Headers: poisonHeaders, Body: []byte(`{"order":1}`),
	}, c: c, received: monotime()}
	c.current.Store(dd)
	c.inFlight.Add(1)
	c.pending.Add(1)
	return dd
}

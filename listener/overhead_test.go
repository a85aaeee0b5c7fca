package listener

import (
	"context"
	"io"
	"log/slog"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/amqpretry/amqpretry/middleware"
)

type nopAck struct{}

func (nopAck) Ack(uint64, bool) error        { return nil }
func (nopAck) Nack(uint64, bool, bool) error { return nil }
func (nopAck) Reject(uint64, bool) error     { return nil }

// BenchmarkDeliveryOverhead is what the listener adds to every message, with
// no broker in the way: one delivery through process (span, chain with
// Retry(5) and Recover, gate, settlement with a fake acknowledger, stats).
// The broker's share of a message's cost varies with the machine; this does
// not.
func BenchmarkDeliveryOverhead(b *testing.B) {
	recoverer := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })
	chain := middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer))
	handler := func(context.Context, *amqp.Delivery) error { return nil }
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"noop-telemetry", nil},
		{"sdk-sampled", []Option{WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample())))}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			l, err := New("q", chain, handler, append(tc.opts, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))...)
			if err != nil {
				b.Fatal(err)
			}
			sv := &supervisor{l: l, ctx: context.Background(), interrupt: make(chan struct{})}
			sv.handlerCtx, sv.cancelHandlers = context.WithCancel(context.Background())
			defer sv.cancelHandlers()
			c := &consumer{sv: sv, gate: make(chan struct{}, 1), interrupt: make(chan struct{})}
			c.ctx = sv.chainContext(sv.handlerCtx, c.interrupt)
			c.handle = l.mw(c.gated(middleware.CatchPanics()(handler)))
			b.ReportAllocs()
			for b.Loop() {
				dd := &delivery{Delivery: amqp.Delivery{Acknowledger: nopAck{}, DeliveryTag: 1, RoutingKey: "q", MessageId: "m"}, c: c, received: monotime()}
				dd.reader.Store(true)
				c.current.Store(dd)
				c.inFlight.Add(1)
				c.pending.Add(1)
				c.process(dd)
			}
		})
	}
}

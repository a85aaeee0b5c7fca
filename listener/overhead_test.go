package listener

import (
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/semconv/v1.39.0/messagingconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/telemetry"
	"github.com/amqpretry/amqpretry/middleware"
)

type nopAck struct{}

func (nopAck) Ack(uint64, bool) error        { return nil }
func (nopAck) Nack(uint64, bool, bool) error { return nil }
func (nopAck) Reject(uint64, bool) error     { return nil }

// discardExporter drops what the batcher hands it: export stays off the
// measurement, as in bench/.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// processCPU is this process's user+system CPU time so far: the batcher's
// goroutine and the garbage collector included, which ns/op on a shared
// 2-core machine shows only in part and with much noise.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds the process's CPU per op since cpu0.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

// sdkProviders are bench/'s OTel SDK set-up: every span sampled and batched
// to a discarding exporter, metrics to a ManualReader. Both are shut down
// when b ends, which ends the batcher's goroutine.
func sdkProviders(b *testing.B) (*sdktrace.TracerProvider, *sdkmetric.MeterProvider) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(discardExporter{}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		if err := tp.Shutdown(context.Background()); err != nil {
			b.Error(err)
		}
		if err := mp.Shutdown(context.Background()); err != nil {
			b.Error(err)
		}
	})
	return tp, mp
}

// BenchmarkDeliveryOverhead is what the listener adds to every message, with
// no broker in the way: one delivery through process (span, chain with
// Retry(5) and Recover, gate, settlement with a fake acknowledger, stats).
// The broker's share of a message's cost varies with the machine; this does
// not.
//
// otel-floor is the SDK's own price for what sdk-sampled exports per
// successful delivery, with no listener code: one CONSUMER span with the
// process span's attributes, and the same measurements on the same
// instruments. sdk-sampled ÷ otel-floor is what our telemetry adds.
//
// sdk-linked is sdk-sampled for a message that carries its producer's
// traceparent, read with the W3C propagator and linked.
func BenchmarkDeliveryOverhead(b *testing.B) {
	recoverer := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })
	chain := middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer))
	handler := func(context.Context, *amqp.Delivery) error { return nil }
	producer := amqp.Table{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	for _, tc := range []struct {
		name    string
		sdk     bool
		headers amqp.Table
	}{
		{"noop-telemetry", false, nil},
		{"sdk-sampled", true, nil},
		{"sdk-linked", true, producer},
	} {
		b.Run(tc.name, func(b *testing.B) {
			opts := []Option{WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}
			if tc.sdk {
				tp, mp := sdkProviders(b)
				opts = append(opts, WithTracerProvider(tp), WithMeterProvider(mp), WithPropagators(propagation.TraceContext{}))
			}
			l, err := New("q", chain, handler, opts...)
			if err != nil {
				b.Fatal(err)
			}
			c := benchConsumer(b, l, handler)
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				dd := &delivery{Delivery: amqp.Delivery{Acknowledger: nopAck{}, Headers: tc.headers, DeliveryTag: 1, RoutingKey: "q", MessageId: "m"}, c: c, received: monotime()}
				dd.reader.Store(true)
				c.current.Store(dd)
				c.inFlight.Add(1)
				c.pending.Add(1)
				c.process(dd)
			}
			reportCPU(b, cpu0)
		})
	}
	b.Run("otel-floor", benchmarkOTelFloor)
}

// benchmarkOTelFloor does per delivery what sdk-sampled exports for one
// handled at the first attempt, written plainly against the SDK: one root
// CONSUMER span with the process span's eight attributes and its settlement,
// messaging.client.consumed.messages and amqpretry.attempts{succeeded} once,
// and messaging.process.duration. It is as frugal as instrumentation can be
// without reaching into the SDK: attribute sets, span options and the
// slices that carry them are built once, and the span's attributes reuse one
// array. What it allocates is the SDK's own. The measurements taken under
// the span get its exemplars, as the listener's do.
func benchmarkOTelFloor(b *testing.B) {
	tp, mp := sdkProviders(b)
	tracer := tp.Tracer("floor")
	meter := mp.Meter("floor")
	duration, err := messagingconv.NewProcessDuration(meter, metric.WithExplicitBucketBoundaries(telemetry.DurationBuckets...))
	if err != nil {
		b.Fatal(err)
	}
	consumed, err := messagingconv.NewClientConsumedMessages(meter)
	if err != nil {
		b.Fatal(err)
	}
	attempts, err := meter.Int64Counter("amqpretry.attempts")
	if err != nil {
		b.Fatal(err)
	}
	messaging := metric.WithAttributeSet(attribute.NewSet(
		semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationName("process"), semconv.MessagingDestinationName("q")))
	messagingAdd, messagingRecord := []metric.AddOption{messaging}, []metric.RecordOption{messaging}
	succeeded := []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
		semconv.MessagingDestinationName("q"), attribute.String("amqpretry.outcome", "succeeded")))}
	attrs := [8]attribute.KeyValue{
		semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"), semconv.MessagingDestinationName("q"),
	}
	// attrs is rewritten in place for each span, so one boxed option and
	// one option slice serve every Start: the SDK copies the attributes.
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs[:]...)}
	ack := []attribute.KeyValue{attribute.String("amqpretry.settlement", "ack")}
	ctx := context.Background()
	d := &amqp.Delivery{Acknowledger: nopAck{}, DeliveryTag: 1, RoutingKey: "q", MessageId: "m"}
	b.ReportAllocs()
	cpu0 := processCPU()
	for b.Loop() {
		began := time.Now()
		consumed.Int64Counter.Add(ctx, 1, messagingAdd...)
		attrs[4] = semconv.MessagingRabbitMQDestinationRoutingKey(d.RoutingKey)
		attrs[5] = semconv.MessagingRabbitMQMessageDeliveryTag(int(d.DeliveryTag))
		attrs[6] = semconv.MessagingMessageBodySize(len(d.Body))
		attrs[7] = semconv.MessagingMessageID(d.MessageId)
		sctx, span := tracer.Start(ctx, "process q", opts...)
		attempts.Add(sctx, 1, succeeded...)
		_ = d.Ack(false)
		span.SetAttributes(ack...)
		span.End()
		duration.Float64Histogram.Record(sctx, time.Since(began).Seconds(), messagingRecord...)
	}
	reportCPU(b, cpu0)
}

// benchConsumer is a consumer of l with no channel, for benchmarks that run
// deliveries through process with a fake acknowledger.
func benchConsumer(b *testing.B, l *Listener, handler middleware.Handler) *consumer {
	sv := &supervisor{l: l, ctx: context.Background(), interrupt: make(chan struct{})}
	sv.handlerCtx, sv.cancelHandlers = context.WithCancel(context.Background())
	b.Cleanup(sv.cancelHandlers)
	c := &consumer{sv: sv, interrupt: make(chan struct{}), acks: l.newSettler(nopAck{}, l.cfg.prefetch, "bench")}
	c.ctx = sv.chainContext(sv.handlerCtx, c.interrupt)
	c.handle = l.mw(c.gated(middleware.CatchPanics()(handler)))
	return c
}

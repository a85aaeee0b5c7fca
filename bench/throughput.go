package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The happy-path variants, in the order each round runs them; raw first, as
// the baseline. -skip can leave out any of them by name.
func throughputVariants(e *env) []variant {
	vs := happyPath(e.cfg.Consumers, e.cfg.Prefetch)
	for i := range vs {
		vs[i].skip = e.cfg.Skip[vs[i].name]
	}
	return vs
}

func happyPath(c, p int) []variant {
	return []variant{
		{name: "raw", run: consumeRaw,
			about: fmt.Sprintf("amqp091-go: %d consumers, each its own channel with Qos(%d), ack one by one", c, p)},
		{name: "listener", run: consumeListener,
			about: fmt.Sprintf("listener, Chain(Retry(5), Recover(Republish)), WithConcurrentConsumers(%d), WithPrefetch(%d), no-op telemetry", c, p)},
		{name: "listener-otel", run: consumeListenerOTel,
			about: "as listener, with the OTel SDK: every span sampled, batched to a discarding exporter; metrics to a ManualReader"},
		{name: "otel-floor", run: consumeOTelFloor,
			about: "as raw, plus per message what the OTel SDK costs at the least for listener-otel's telemetry: one CONSUMER span around the ack " +
				"(same SDK set-up, name and attributes) and the same three measurements with the same attribute sets (process duration, consumed messages, attempts)"},
		{name: "watermill", run: consumeWatermill,
			about: fmt.Sprintf("watermill-amqp subscriber, router with PoisonQueue and Retry{MaxRetries: 5}: %d handlers (channels) with Qos(%d), one message in flight each", c, p)},
	}
}

func variantNames() []string {
	var names []string
	for _, v := range happyPath(0, 0) {
		names = append(names, v.name)
	}
	return names
}

// quietLogger drops the listener's info and debug lines but keeps warnings:
// a connection lost mid-benchmark should be seen.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// consumeRaw is the baseline: the least a Go client can do per message.
func consumeRaw(ctx context.Context, e *env, q string, n int) (Sample, error) {
	return consumeDirect(ctx, e, q, n, "raw-", func() func(amqp.Delivery) {
		return func(d amqp.Delivery) { _ = d.Ack(false) }
	})
}

// consumeDirect consumes q on amqp091-go channels of its own, one consumer
// each, settling every delivery with a settle func made for its consumer
// (so that it may keep scratch space without locks).
func consumeDirect(ctx context.Context, e *env, q string, n int, tagPrefix string, newSettle func() func(amqp.Delivery)) (Sample, error) {
	t := newTally(n)
	cpu0 := e.cpuMark()
	conn, err := amqp.Dial(e.broker.url)
	if err != nil {
		return Sample{}, err
	}
	// Closing the connection ends the deliveries, which ends the goroutines.
	var wg sync.WaitGroup
	defer func() {
		_ = conn.Close()
		wg.Wait()
	}()
	for i := range e.cfg.Consumers {
		ch, err := conn.Channel()
		if err != nil {
			return Sample{}, err
		}
		if err := ch.Qos(e.cfg.Prefetch, 0, false); err != nil {
			return Sample{}, err
		}
		deliveries, err := ch.Consume(q, fmt.Sprint(tagPrefix, i), false, false, false, false, nil)
		if err != nil {
			return Sample{}, err
		}
		settle := newSettle()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range deliveries {
				settle(d)
				t.hit()
			}
		}()
	}
	if err := t.wait(ctx); err != nil {
		return Sample{}, err
	}
	return sampleOf(t, cpu0), nil
}

func consumeListener(ctx context.Context, e *env, q string, n int) (Sample, error) {
	return consumeWithListener(ctx, e, q, n)
}

// consumeListenerOTel is the listener with real telemetry: the price of
// spans and metrics on every delivery and attempt, with export kept off the
// measurement (the exporter drops what it gets).
func consumeListenerOTel(ctx context.Context, e *env, q string, n int) (s Sample, err error) {
	sdk := newOTelSDK()
	defer func() { err = errors.Join(err, sdk.shutdown(ctx)) }()
	return consumeWithListener(ctx, e, q, n, listener.WithTracerProvider(sdk.tp), listener.WithMeterProvider(sdk.mp))
}

// otelSDK is the OpenTelemetry SDK as listener-otel and otel-floor set it
// up: every span sampled and batched to an exporter that drops them,
// metrics aggregated for a reader that is never asked (the test asks).
type otelSDK struct {
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
	reader *sdkmetric.ManualReader
}

func newOTelSDK() *otelSDK {
	reader := sdkmetric.NewManualReader()
	return &otelSDK{
		tp:     sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(discardExporter{})),
		mp:     sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		reader: reader,
	}
}

// shutdown stops the providers, and with them the batcher's goroutine.
func (o *otelSDK) shutdown(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	return errors.Join(o.tp.Shutdown(ctx), o.mp.Shutdown(ctx))
}

type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// consumeWithListener runs the chain a user would write, on the happy path:
// the recoverer and its publisher exist but are never called.
func consumeWithListener(ctx context.Context, e *env, q string, n int, opts ...listener.Option) (s Sample, err error) {
	dlq := q + ".dlq"
	pub, done, err := e.withRecovery(dlq)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, done()) }()

	t := newTally(n)
	mw := middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer.Republish(pub, "", dlq)))
	handle := func(context.Context, *amqp.Delivery) error {
		t.hit()
		return nil
	}
	cpu0 := e.cpuMark()
	stop, err := startListener(ctx, e, q, mw, handle, opts...)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	if err := t.wait(ctx); err != nil {
		return Sample{}, err
	}
	return sampleOf(t, cpu0), nil
}

// startListener runs a listener with the configured consumers and prefetch
// (opts may override them) until stop is called; stop returns Run's error.
func startListener(ctx context.Context, e *env, q string, mw middleware.Middleware, h middleware.Handler, opts ...listener.Option) (stop func() error, err error) {
	base := []listener.Option{
		listener.WithURL(e.broker.url),
		listener.WithConcurrentConsumers(e.cfg.Consumers),
		listener.WithPrefetch(e.cfg.Prefetch),
		listener.WithLogger(quietLogger()),
	}
	l, err := listener.New(q, mw, h, append(base, opts...)...)
	if err != nil {
		return nil, err
	}
	return goRun(ctx, l), nil
}

// goRun runs l until stop is called; stop returns Run's error.
func goRun(ctx context.Context, l *listener.Listener) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx) }()
	return func() error {
		cancel()
		return <-ran
	}
}

package telemetry

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/semconv/v1.39.0/messagingconv"
	"go.opentelemetry.io/otel/trace"
)

// Config selects the providers; nil fields mean the global ones
// (otel.GetTracerProvider and friends), so setting the globals is enough.
type Config struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagators    propagation.TextMapPropagator
}

// Telemetry is a tracer, the propagators and the library's instruments.
// Its two halves come from different providers and may be combined: a
// Retry with a meter provider of its own traces with the listener's tracer
// (see Combine).
type Telemetry struct {
	Tracer      trace.Tracer
	Propagators propagation.TextMapPropagator
	*Metrics

	noopUntil atomic.Int64 // monotonic nanos since epoch: no root span is worth starting before then
}

// Metrics are the library's instruments, with the attribute sets they are
// recorded with.
type Metrics struct {
	ProcessDuration   messagingconv.ProcessDuration         // messaging.process.duration
	Consumed          messagingconv.ClientConsumedMessages  // messaging.client.consumed.messages
	Sent              messagingconv.ClientSentMessages      // messaging.client.sent.messages
	OperationDuration messagingconv.ClientOperationDuration // messaging.client.operation.duration: publish until confirm
	Attempts          metric.Int64Counter                   // amqpretry.attempts, by outcome
	Retries           metric.Int64Counter                   // amqpretry.retries
	Recoveries        metric.Int64Counter                   // amqpretry.recoveries, by outcome
	DeadLettered      metric.Int64Counter                   // amqpretry.dead_lettered
	ActiveConsumers   metric.Int64UpDownCounter             // amqpretry.consumers.active
	Parked            metric.Int64UpDownCounter             // amqpretry.deliveries.parked
	KillSwitchTrips   metric.Int64Counter                   // amqpretry.killswitch.trips
	KillSwitchState   metric.Int64Gauge                     // amqpretry.killswitch.state: 0 closed, 1 tripped, 2 probing

	mu        sync.RWMutex
	sets      map[setKey]*Attrs      // see Attrs
	queues    map[string]*QueueAttrs // see ForQueue
	lastQueue atomic.Pointer[QueueAttrs]
}

// DurationBuckets are the explicit histogram buckets, in seconds, for
// processing and publishing times: from a fast handler to a slow retry.
var DurationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// New builds the tracer and instruments. Instrument errors (a provider that
// refuses a name) fall back to no-op instruments: telemetry never stops
// message processing.
func New(cfg Config) *Telemetry {
	tp, mp, prop := cfg.TracerProvider, cfg.MeterProvider, cfg.Propagators
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	return &Telemetry{
		Tracer:      tp.Tracer(ScopeName, trace.WithInstrumentationVersion(Version), trace.WithSchemaURL(semconv.SchemaURL)),
		Propagators: prop,
		Metrics:     newMetrics(mp),
	}
}

func newMetrics(mp metric.MeterProvider) *Metrics {
	meter := mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version), metric.WithSchemaURL(semconv.SchemaURL))
	m := &Metrics{
		sets:   map[setKey]*Attrs{},
		queues: map[string]*QueueAttrs{},
	}
	buckets := metric.WithExplicitBucketBoundaries(DurationBuckets...)
	m.ProcessDuration, _ = messagingconv.NewProcessDuration(meter, buckets)
	m.Consumed, _ = messagingconv.NewClientConsumedMessages(meter)
	m.Sent, _ = messagingconv.NewClientSentMessages(meter)
	m.OperationDuration, _ = messagingconv.NewClientOperationDuration(meter, buckets)
	m.Attempts, _ = meter.Int64Counter("amqpretry.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Handler attempts made by Retry, by outcome."))
	m.Retries, _ = meter.Int64Counter("amqpretry.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Retries Retry scheduled after a failed attempt."))
	m.Recoveries, _ = meter.Int64Counter("amqpretry.recoveries", metric.WithUnit("{message}"),
		metric.WithDescription("Messages handed to a recoverer, by outcome: recovered, failed, rejected."))
	m.DeadLettered, _ = meter.Int64Counter("amqpretry.dead_lettered", metric.WithUnit("{message}"),
		metric.WithDescription("Messages a listener's recoverer published to a dead-letter destination (not a retry tier) and acked."))
	m.ActiveConsumers, _ = meter.Int64UpDownCounter("amqpretry.consumers.active", metric.WithUnit("{consumer}"),
		metric.WithDescription("Consumers a listener runs now."))
	m.Parked, _ = meter.Int64UpDownCounter("amqpretry.deliveries.parked", metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries waiting between attempts or before a requeue, holding no worker."))
	m.KillSwitchTrips, _ = meter.Int64Counter("amqpretry.killswitch.trips", metric.WithUnit("{trip}"),
		metric.WithDescription("Times a listener's kill switch stopped consuming."))
	m.KillSwitchState, _ = meter.Int64Gauge("amqpretry.killswitch.state", metric.WithUnit("1"),
		metric.WithDescription("A listener's kill switch: 0 closed (consuming), 1 tripped, 2 probing."))
	return m
}

// Combine is the telemetry that traces like tracing (tracer, propagators)
// and measures like metrics. It shares both halves, caches included, so it
// costs one small allocation.
func Combine(tracing, metrics *Telemetry) *Telemetry {
	return &Telemetry{Tracer: tracing.Tracer, Propagators: tracing.Propagators, Metrics: metrics.Metrics}
}

var (
	defaultOnce sync.Once
	defaultTel  *Telemetry
)

// Default is the telemetry of the global providers, built once. The globals
// delegate, so providers set later still receive everything.
func Default() *Telemetry {
	defaultOnce.Do(func() { defaultTel = New(Config{}) })
	return defaultTel
}

// Tracing reports whether a root span is worth starting. A tracer that
// returns an invalid span context for a root span records nothing (the
// global provider before an SDK is set, or a no-op provider); once one is seen,
// root spans are skipped for a second, then tried again, so an SDK set later
// is picked up within a second. With a parent span in ctx, always true.
func (t *Telemetry) Tracing(ctx context.Context) bool {
	until := t.noopUntil.Load()
	return until == 0 || Mono() >= until || trace.SpanContextFromContext(ctx).IsValid()
}

// TracingRoot is Tracing for a span known to have no parent, at now (Mono).
func (t *Telemetry) TracingRoot(now int64) bool {
	until := t.noopUntil.Load()
	return until == 0 || now >= until
}

// Mono is nanoseconds on the monotonic clock since the process began: one
// clock read where time.Now makes two, for the readings taken on every
// message.
func Mono() int64 { return int64(time.Since(epoch)) }

// MonoTime is the time at which Mono read mono, wall clock and monotonic
// reading both, as time.Now would have returned it then (unless the wall
// clock was set in between): a timestamp taken with Mono's one clock read,
// for the rare span that needs it afterwards.
func MonoTime(mono int64) time.Time {
	now := time.Now()
	return now.Add(time.Duration(mono) - now.Sub(epoch))
}

// ObserveRoot notes what the tracer returned for a root span, for Tracing.
func (t *Telemetry) ObserveRoot(span trace.Span) {
	if span.SpanContext().IsValid() {
		if t.noopUntil.Load() != 0 { // every consumer gets here on every delivery: write only a change
			t.noopUntil.Store(0)
		}
	} else {
		t.noopUntil.Store(Mono() + int64(time.Second))
	}
}

// epoch anchors the monotonic readings of Tracing: one clock read instead
// of time.Now's two, on every message.
var epoch = time.Now()

// NoSpan records nothing; it stands in for a span not worth starting.
var NoSpan = trace.SpanFromContext(context.Background())

type ctxKey struct{}

// With returns a context carrying t, for the middlewares of a chain.
func With(ctx context.Context, t *Telemetry) context.Context {
	return context.WithValue(ctx, ctxKey{}, t)
}

// From returns the telemetry in ctx, or Default.
func From(ctx context.Context) *Telemetry {
	if t, ok := ctx.Value(ctxKey{}).(*Telemetry); ok {
		return t
	}
	return Default()
}

// ContextKey lets a custom context type answer for the telemetry key
// without an extra allocation.
func ContextKey() any { return ctxKey{} }

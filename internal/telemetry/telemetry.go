package telemetry

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
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
type Telemetry struct {
	Tracer      trace.Tracer
	Propagators propagation.TextMapPropagator

	ProcessDuration   messagingconv.ProcessDuration         // messaging.process.duration
	Consumed          messagingconv.ClientConsumedMessages  // messaging.client.consumed.messages
	Sent              messagingconv.ClientSentMessages      // messaging.client.sent.messages
	OperationDuration messagingconv.ClientOperationDuration // messaging.client.operation.duration: publish until confirm
	Attempts          metric.Int64Counter                   // amqpretry.attempts, by outcome
	Retries           metric.Int64Counter                   // amqpretry.retries
	Recoveries        metric.Int64Counter                   // amqpretry.recoveries, by outcome
	ActiveConsumers   metric.Int64UpDownCounter             // amqpretry.consumers.active
	Parked            metric.Int64UpDownCounter             // amqpretry.deliveries.parked

	noopUntil atomic.Int64 // monotonic nanos since epoch: no root span is worth starting before then

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
	meter := mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version), metric.WithSchemaURL(semconv.SchemaURL))
	t := &Telemetry{
		sets:        map[setKey]*Attrs{},
		queues:      map[string]*QueueAttrs{},
		Tracer:      tp.Tracer(ScopeName, trace.WithInstrumentationVersion(Version), trace.WithSchemaURL(semconv.SchemaURL)),
		Propagators: prop,
	}
	buckets := metric.WithExplicitBucketBoundaries(DurationBuckets...)
	t.ProcessDuration, _ = messagingconv.NewProcessDuration(meter, buckets)
	t.Consumed, _ = messagingconv.NewClientConsumedMessages(meter)
	t.Sent, _ = messagingconv.NewClientSentMessages(meter)
	t.OperationDuration, _ = messagingconv.NewClientOperationDuration(meter, buckets)
	t.Attempts, _ = meter.Int64Counter("amqpretry.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Handler attempts made by Retry, by outcome."))
	t.Retries, _ = meter.Int64Counter("amqpretry.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Retries Retry scheduled after a failed attempt."))
	t.Recoveries, _ = meter.Int64Counter("amqpretry.recoveries", metric.WithUnit("{message}"),
		metric.WithDescription("Messages handed to a recoverer, by outcome: recovered, failed, rejected."))
	t.ActiveConsumers, _ = meter.Int64UpDownCounter("amqpretry.consumers.active", metric.WithUnit("{consumer}"),
		metric.WithDescription("Consumers a listener runs now."))
	t.Parked, _ = meter.Int64UpDownCounter("amqpretry.deliveries.parked", metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries waiting between attempts or before a requeue, holding no worker."))
	return t
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

// ObserveRoot notes what the tracer returned for a root span, for Tracing.
func (t *Telemetry) ObserveRoot(span trace.Span) {
	if span.SpanContext().IsValid() {
		t.noopUntil.Store(0)
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

// Attrs is an attribute set with the metric options that carry it, ready to
// pass to Add and Record without allocating.
type Attrs struct {
	Set    attribute.Set
	Add    []metric.AddOption
	Record []metric.RecordOption
}

// Attrs returns the cached Attrs of up to four string key-value pairs.
func (t *Telemetry) Attrs(kv ...string) *Attrs {
	var key setKey
	copy(key[:], kv) // more than four pairs is a programming error
	t.mu.RLock()
	a, ok := t.sets[key]
	t.mu.RUnlock()
	if ok {
		return a
	}
	list := make([]attribute.KeyValue, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		list = append(list, attribute.String(kv[i], kv[i+1]))
	}
	set := attribute.NewSet(list...)
	opt := metric.WithAttributeSet(set)
	a = &Attrs{Set: set, Add: []metric.AddOption{opt}, Record: []metric.RecordOption{opt}}
	t.mu.Lock()
	t.sets[key] = a
	t.mu.Unlock()
	return a
}

type setKey [8]string

// Outcome names shared by the attempt and recovery metrics.
const (
	OutcomeSucceeded    = "succeeded"
	OutcomeRetrying     = "retrying"
	OutcomeExhausted    = "exhausted"
	OutcomePermanent    = "permanent"
	OutcomeNotRetryable = "not_retryable"
	OutcomeTimeLimited  = "time_limited"
	OutcomeHandedOff    = "handed_off"
	OutcomeInterrupted  = "interrupted"
	OutcomeRecovered    = "recovered"
)

// QueueAttrs holds, for one queue, the attribute options of every outcome,
// so that a delivery looks them up once.
type QueueAttrs struct {
	name                                 string
	Queue                                *Attrs // messaging.destination.name only
	Succeeded, Retrying, Exhausted       *Attrs
	Permanent, NotRetryable, TimeLimited *Attrs
	HandedOff, Interrupted, Recovered    *Attrs
}

// ForQueue returns the cached QueueAttrs of queue.
func (t *Telemetry) ForQueue(queue string) *QueueAttrs {
	if last := t.lastQueue.Load(); last != nil && last.name == queue {
		return last // a listener asks for the same queue every time
	}
	q := t.forQueue(queue)
	t.lastQueue.Store(q)
	return q
}

func (t *Telemetry) forQueue(queue string) *QueueAttrs {
	t.mu.RLock()
	q, ok := t.queues[queue]
	t.mu.RUnlock()
	if ok {
		return q
	}
	const dest, outcome = "messaging.destination.name", "amqpretry.outcome"
	o := func(name string) *Attrs { return t.Attrs(dest, queue, outcome, name) }
	q = &QueueAttrs{
		name:      queue,
		Queue:     t.Attrs(dest, queue),
		Succeeded: o(OutcomeSucceeded), Retrying: o(OutcomeRetrying), Exhausted: o(OutcomeExhausted),
		Permanent: o(OutcomePermanent), NotRetryable: o(OutcomeNotRetryable), TimeLimited: o(OutcomeTimeLimited),
		HandedOff: o(OutcomeHandedOff), Interrupted: o(OutcomeInterrupted), Recovered: o(OutcomeRecovered),
	}
	t.mu.Lock()
	t.queues[queue] = q
	t.mu.Unlock()
	return q
}

// Outcome returns the Attrs of a named outcome.
func (q *QueueAttrs) Outcome(name string) *Attrs {
	switch name {
	case OutcomeSucceeded:
		return q.Succeeded
	case OutcomeRetrying:
		return q.Retrying
	case OutcomePermanent:
		return q.Permanent
	case OutcomeNotRetryable:
		return q.NotRetryable
	case OutcomeTimeLimited:
		return q.TimeLimited
	case OutcomeHandedOff:
		return q.HandedOff
	case OutcomeInterrupted:
		return q.Interrupted
	case OutcomeRecovered:
		return q.Recovered
	}
	return q.Exhausted
}

// Mix is the telemetry that traces like tracing (tracer, propagators) and
// measures like metrics (every instrument): for a Retry given one provider of
// its own, which takes the other from the listener around it.
func Mix(tracing, metrics *Telemetry) *Telemetry {
	return &Telemetry{
		Tracer:            tracing.Tracer,
		Propagators:       tracing.Propagators,
		ProcessDuration:   metrics.ProcessDuration,
		Consumed:          metrics.Consumed,
		Sent:              metrics.Sent,
		OperationDuration: metrics.OperationDuration,
		Attempts:          metrics.Attempts,
		Retries:           metrics.Retries,
		Recoveries:        metrics.Recoveries,
		ActiveConsumers:   metrics.ActiveConsumers,
		Parked:            metrics.Parked,
		sets:              map[setKey]*Attrs{},
		queues:            map[string]*QueueAttrs{},
	}
}

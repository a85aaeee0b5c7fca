package listener_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/telemetry"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

type observed struct {
	tp     *sdktrace.TracerProvider
	spans  *tracetest.SpanRecorder
	mp     *sdkmetric.MeterProvider
	reader *sdkmetric.ManualReader
}

func observe(t *testing.T) *observed {
	o := &observed{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	o.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(o.spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	o.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(o.reader))
	t.Cleanup(func() {
		_ = o.tp.Shutdown(context.Background())
		_ = o.mp.Shutdown(context.Background())
	})
	return o
}

func (o *observed) options() []listener.Option {
	return []listener.Option{listener.WithTracerProvider(o.tp), listener.WithMeterProvider(o.mp), listener.WithPropagators(propagation.TraceContext{})}
}

func (o *observed) named(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range o.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// sum returns the total of a counter, or the count of a histogram, over the
// data points whose attributes include all of match.
func (o *observed) sum(t *testing.T, name string, match ...attribute.KeyValue) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := o.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			has := func(set attribute.Set) bool {
				for _, kv := range match {
					if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
						return false
					}
				}
				return true
			}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					if has(p.Attributes) {
						total += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					if has(p.Attributes) {
						total += int64(p.Count)
					}
				}
			}
		}
	}
	return total
}

func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// producerSpan publishes msg with the context of a producer span in its
// headers and returns that span's context.
func producerSpan(t *testing.T, o *observed, q string, msg amqp.Publishing) trace.SpanContext {
	t.Helper()
	ctx, span := o.tp.Tracer("test-producer").Start(context.Background(), "send "+q, trace.WithSpanKind(trace.SpanKindProducer))
	span.End()
	msg.Headers = amqp.Table{}
	propagation.TraceContext{}.Inject(ctx, telemetry.TableCarrier(msg.Headers))
	brokertest.Publish(t, q, msg)
	return span.SpanContext()
}

func TestTelemetryOfARetriedDelivery(t *testing.T) {
	o := observe(t)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	producer := producerSpan(t, o, q, amqp.Publishing{MessageId: "m-1", CorrelationId: "c-1", Body: []byte("hello")})

	var calls atomic.Int64
	r := start(t, q, middleware.Chain(middleware.Retry(5, middleware.WithInitialInterval(20*time.Millisecond)), requeueExhausted()), func(context.Context, *amqp.Delivery) error {
		if calls.Add(1) < 3 {
			return errors.New("flaky")
		}
		return nil
	}, o.options()...)
	brokertest.Eventually(t, 5*time.Second, "handled", func() bool { return r.Stats().Handled == 1 })
	if n := o.sum(t, "amqpretry.consumers.active"); n != 1 {
		t.Errorf("amqpretry.consumers.active = %d while running, want 1", n)
	}
	r.Stop(t)

	processes := o.named("process " + q)
	if len(processes) != 1 {
		t.Fatalf("%d process spans, want 1", len(processes))
	}
	p := processes[0]
	if p.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("process span kind %v", p.SpanKind())
	}
	for key, want := range map[string]string{
		"messaging.system": "rabbitmq", "messaging.operation.type": "process", "messaging.destination.name": q,
		"messaging.rabbitmq.destination.routing_key": q, "messaging.message.id": "m-1",
		"messaging.message.conversation_id": "c-1", "amqpretry.settlement": "ack",
	} {
		if got := attr(p, key).Emit(); got != want {
			t.Errorf("process span %s = %q, want %q", key, got, want)
		}
	}
	if len(p.Links()) != 1 || p.Links()[0].SpanContext.SpanID() != producer.SpanID() {
		t.Errorf("process span links %v, want the producer's span %v", p.Links(), producer.SpanID())
	}
	if p.Parent().IsValid() {
		t.Error("the process span is a root by default: the producer is linked, not its parent")
	}
	attempts := o.named("attempt")
	if len(attempts) != 3 {
		t.Fatalf("%d attempt spans, want 3", len(attempts))
	}
	for i, a := range attempts {
		if a.Parent().SpanID() != p.SpanContext().SpanID() {
			t.Errorf("attempt %d is not a child of the process span", i+1)
		}
		if n := attr(a, middleware.AttrAttempt).AsInt64(); n != int64(i+1) {
			t.Errorf("attempt span %d has number %d", i+1, n)
		}
		wantOutcome, wantEvents := "retrying", 1
		if i == 2 {
			wantOutcome, wantEvents = "succeeded", 0
		}
		if got := attr(a, middleware.AttrOutcome).AsString(); got != wantOutcome {
			t.Errorf("attempt %d outcome %q, want %q", i+1, got, wantOutcome)
		}
		if len(a.Events()) != wantEvents {
			t.Errorf("attempt %d has %d events, want %d (the scheduled retry)", i+1, len(a.Events()), wantEvents)
		}
	}
	outcome := func(o string) attribute.KeyValue { return attribute.String(middleware.AttrOutcome, o) }
	checks := []struct {
		metric string
		match  []attribute.KeyValue
		want   int64
	}{
		{"messaging.client.consumed.messages", nil, 1},
		{"messaging.process.duration", nil, 1},
		{"amqpretry.attempts", nil, 3},
		{"amqpretry.attempts", []attribute.KeyValue{outcome("retrying")}, 2},
		{"amqpretry.attempts", []attribute.KeyValue{outcome("succeeded")}, 1},
		{"amqpretry.retries", nil, 2},
		{"amqpretry.deliveries.parked", nil, 0}, // up and down again
		{"amqpretry.consumers.active", nil, 0},
	}
	for _, c := range checks {
		if got := o.sum(t, c.metric, c.match...); got != c.want {
			t.Errorf("%s %v = %d, want %d", c.metric, c.match, got, c.want)
		}
	}
}

func TestRecoveredMessageCarriesTheProducerSpan(t *testing.T) {
	o := observe(t)
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, q, nil)
	brokertest.Queue(t, dlq, nil)
	pub, err := publisher.New(brokertest.URL(), publisher.WithTracerProvider(o.tp), publisher.WithMeterProvider(o.mp),
		publisher.WithPropagators(propagation.TraceContext{}))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	producerSpan(t, o, q, amqp.Publishing{MessageId: "bad"})
	r := start(t, q, middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(10*time.Millisecond)), middleware.Recover(recoverer.Republish(pub, "", dlq))),
		func(context.Context, *amqp.Delivery) error { return errors.New("bug 42") }, o.options()...)
	brokertest.Eventually(t, 5*time.Second, "the message on the DLQ", func() bool { return brokertest.Depth(t, dlq) == 1 })
	brokertest.Eventually(t, 5*time.Second, "the original acked", func() bool { return r.Stats().Handled == 1 })
	r.Stop(t)

	sends := o.named("send amq.default")
	if len(sends) != 1 || sends[0].SpanKind() != trace.SpanKindProducer {
		t.Fatalf("%d send spans, want one PRODUCER span", len(sends))
	}
	send := sends[0]
	attempts := o.named("attempt")
	if len(attempts) != 2 || send.Parent().SpanID() != attempts[1].SpanContext().SpanID() {
		t.Errorf("the send span's parent is %v, want the last attempt's span", send.Parent().SpanID())
	}
	d, _ := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	inMessage := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), telemetry.TableCarrier(d.Headers)))
	if inMessage.SpanID() != send.SpanContext().SpanID() || inMessage.TraceID() != send.SpanContext().TraceID() {
		t.Errorf("the DLQ message carries %v, want the send span %v", inMessage, send.SpanContext())
	}
	if got := o.sum(t, "amqpretry.recoveries", attribute.String(middleware.AttrOutcome, "recovered")); got != 1 {
		t.Errorf("amqpretry.recoveries{recovered} = %d, want 1", got)
	}
	if got := o.sum(t, "amqpretry.attempts", attribute.String(middleware.AttrOutcome, "recovered")); got != 1 {
		t.Errorf("amqpretry.attempts{recovered} = %d, want 1: the last attempt ended in the recoverer", got)
	}
	if got := o.sum(t, "messaging.client.sent.messages"); got != 1 {
		t.Errorf("messaging.client.sent.messages = %d, want 1", got)
	}
	if got := o.sum(t, "messaging.client.operation.duration"); got != 1 {
		t.Errorf("messaging.client.operation.duration count = %d, want 1 (publish to confirm)", got)
	}
}

func TestProducerAsParent(t *testing.T) {
	o := observe(t)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	producer := producerSpan(t, o, q, amqp.Publishing{})
	r := start(t, q, nil, func(context.Context, *amqp.Delivery) error { return nil }, append(o.options(), listener.WithProducerAsParent())...)
	brokertest.Eventually(t, 5*time.Second, "handled", func() bool { return r.Stats().Handled == 1 })
	r.Stop(t)
	p := o.named("process " + q)
	if len(p) != 1 || p[0].Parent().SpanID() != producer.SpanID() || p[0].SpanContext().TraceID() != producer.TraceID() {
		t.Fatalf("process span parent %v, want the producer %v", p[0].Parent(), producer)
	}
}

func TestFailedDeliveryMarksTheSpan(t *testing.T) {
	o := observe(t)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{})
	// (WithRedeliveryLimit is what lets a Retry without a Recover through New.)
	r := start(t, q, middleware.Retry(1), func(context.Context, *amqp.Delivery) error {
		return middleware.Permanent(errors.New("invalid JSON"))
	}, append(o.options(), listener.WithRedeliveryLimit(5))...)
	brokertest.Eventually(t, 5*time.Second, "rejected", func() bool { return r.Stats().Rejected == 1 })
	r.Stop(t)
	p := o.named("process " + q)[0]
	if p.Status().Code.String() != "Error" || attr(p, "error.type").AsString() != "*errors.errorString" || attr(p, "amqpretry.settlement").AsString() != "reject" {
		t.Errorf("status %v, error.type %q, settlement %q", p.Status(), attr(p, "error.type").AsString(), attr(p, "amqpretry.settlement").AsString())
	}
	if got := o.sum(t, "messaging.process.duration", attribute.String("error.type", "*errors.errorString")); got != 1 {
		t.Errorf("process duration with error.type = %d, want 1", got)
	}
	if got := o.sum(t, "amqpretry.attempts", attribute.String(middleware.AttrOutcome, "permanent")); got != 1 {
		t.Errorf("attempts{permanent} = %d, want 1", got)
	}
}

func TestFirstAttemptSuccessHasNoAttemptSpan(t *testing.T) {
	o := observe(t)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{})
	r := start(t, q, middleware.Chain(middleware.Retry(3), requeueExhausted()), func(ctx context.Context, _ *amqp.Delivery) error {
		_, s := o.tp.Tracer("handler").Start(ctx, "query")
		s.End()
		return nil
	}, o.options()...)
	brokertest.Eventually(t, 5*time.Second, "handled", func() bool { return r.Stats().Handled == 1 })
	r.Stop(t)
	if n := len(o.named("attempt")); n != 0 {
		t.Errorf("%d attempt spans for a delivery handled at once, want none: the process span is the attempt", n)
	}
	process, query := o.named("process "+q), o.named("query")
	if len(process) != 1 || len(query) != 1 || query[0].Parent().SpanID() != process[0].SpanContext().SpanID() {
		t.Fatal("the handler's span must hang under the process span")
	}
	if got := o.sum(t, "amqpretry.attempts", attribute.String(middleware.AttrOutcome, "succeeded")); got != 1 {
		t.Errorf("attempts{succeeded} = %d: the metric counts every attempt, span or not", got)
	}
}

// A span in Run's context is not every delivery's parent: each process span
// is a root, linked to its producer.
func TestProcessSpansAreRoots(t *testing.T) {
	o := observe(t)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{}, amqp.Publishing{})
	runCtx, runSpan := o.tp.Tracer("app").Start(context.Background(), "main")
	defer runSpan.End()
	l, err := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		append(o.options(), listener.WithURL(brokertest.URL()), logTo(t, false))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(runCtx)
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	brokertest.Eventually(t, 5*time.Second, "handled", func() bool { return l.Stats().Handled == 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	processes := o.named("process " + q)
	if len(processes) != 2 || processes[0].Parent().IsValid() || processes[0].SpanContext().TraceID() == processes[1].SpanContext().TraceID() {
		t.Fatalf("process spans must be roots of traces of their own, not children of Run's span")
	}
}

// A Retry given only one provider of its own takes the other from the
// listener: its own meter with the listener's tracer, or its own tracer with
// the listener's meter.
func TestRetryMixesItsProviderWithTheListeners(t *testing.T) {
	for _, own := range []string{"meter", "tracer"} {
		t.Run("own "+own, func(t *testing.T) {
			o, mine := observe(t), observe(t)
			opt := middleware.WithMeterProvider(mine.mp)
			if own == "tracer" {
				opt = middleware.WithTracerProvider(mine.tp)
			}
			q := brokertest.Name(t, "q")
			brokertest.Queue(t, q, nil)
			brokertest.Publish(t, q, amqp.Publishing{})
			var calls atomic.Int64
			r := start(t, q, middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(10*time.Millisecond), opt), requeueExhausted()),
				func(context.Context, *amqp.Delivery) error {
					if calls.Add(1) < 3 {
						return errors.New("flaky")
					}
					return nil
				}, o.options()...)
			brokertest.Eventually(t, 5*time.Second, "handled", func() bool { return r.Stats().Handled == 1 })
			r.Stop(t)
			spans, attempts := o, mine // where the attempt spans and metrics belong
			if own == "tracer" {
				spans, attempts = mine, o
			}
			if n := len(spans.named("attempt")); n != 3 {
				t.Errorf("%d attempt spans on the expected tracer, want 3", n)
			}
			if n := len(o.named("attempt")) + len(mine.named("attempt")); n != 3 {
				t.Errorf("%d attempt spans in all, want 3", n)
			}
			if got := attempts.sum(t, "amqpretry.attempts"); got != 3 {
				t.Errorf("attempts on the expected meter = %d, want 3", got)
			}
			if got := o.sum(t, "amqpretry.attempts") + mine.sum(t, "amqpretry.attempts"); got != 3 {
				t.Errorf("attempts in all = %d, want 3: each is recorded once", got)
			}
		})
	}
}

// The process span ends when processing does, not after the requeue delay.
func TestProcessSpanExcludesTheRequeueDelay(t *testing.T) {
	o := observe(t)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{})
	r := start(t, q, nil, func(context.Context, *amqp.Delivery) error { return errors.New("always") },
		append(o.options(), listener.WithRequeueDelay(600*time.Millisecond, 600*time.Millisecond))...)
	brokertest.Eventually(t, 5*time.Second, "a requeue after the delay", func() bool { return r.Stats().Requeued >= 2 })
	r.Stop(t)
	for _, p := range o.named("process " + q) {
		if d := p.EndTime().Sub(p.StartTime()); d > 300*time.Millisecond {
			t.Errorf("a process span lasted %v: it includes the 600ms requeue delay", d)
		}
	}
}

// nilDerefError's methods read its fields: returned as a typed nil (var e
// *nilDerefError; return e), every one of them panics.
type nilDerefError struct{ cause error }

func (e *nilDerefError) Error() string { return "broken: " + e.cause.Error() }
func (e *nilDerefError) Unwrap() error { return e.cause }

type errorPanicsOnly struct{}

func (*errorPanicsOnly) Error() string { panic("Error called") }

// A handler error whose methods panic is a failure like any other: it is
// requeued and handled later, with tracing on and a JSON log (which calls
// Error itself), instead of taking the process down in the listener's
// telemetry or settlement, outside any recover.
func TestHandlerErrorWhoseMethodsPanic(t *testing.T) {
	var typedNil *nilDerefError
	var onlyError *errorPanicsOnly
	for _, tt := range []struct {
		name    string
		mw      middleware.Middleware
		err     error
		logged  string
		recover bool
	}{
		{"Error panics, no middleware", nil, onlyError, "its Error method panicked: Error called", false},
		{"Error and Unwrap panic, no middleware", nil, typedNil, "whose Unwrap or Is method panicked", false},
		{"Error and Unwrap panic, Retry and Recover", nil, typedNil, "", true},
		// CatchPanics passes this one on (its Unwrap is fine): Retry's span and
		// Recover's exception attributes format it themselves.
		{"Error panics, Retry and Recover", nil, onlyError, "", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := observe(t)
			q := brokertest.Name(t, "q")
			brokertest.Queue(t, q, nil)
			brokertest.Publish(t, q, amqp.Publishing{MessageId: "m"})
			var logs testlog.Buffer
			var recovered atomic.Int32
			mw := tt.mw
			if tt.recover {
				mw = middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(time.Millisecond)),
					middleware.Recover(middleware.RecovererFunc(func(_ context.Context, _ *amqp.Delivery, cause error) error {
						if got := recoverer.ErrorString(cause); !strings.Contains(got, "panicked") {
							t.Errorf("the recoverer got %q", got)
						}
						recovered.Add(1)
						return nil
					})))
			}
			var calls atomic.Int32
			r := start(t, q, mw, func(context.Context, *amqp.Delivery) error {
				if calls.Add(1) == 1 || tt.recover {
					return tt.err
				}
				return nil
			}, append(o.options(), listener.WithRequeueDelay(10*time.Millisecond, 10*time.Millisecond),
				listener.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))...)
			brokertest.Eventually(t, 10*time.Second, "handled after the failure", func() bool { return r.Stats().Handled == 1 })
			r.Stop(t)
			if !strings.Contains(logs.String(), tt.logged) {
				t.Errorf("the log does not say %q:\n%s", tt.logged, logs.String())
			}
			if tt.recover && recovered.Load() != 1 {
				t.Errorf("recovered %d times, want once after 2 attempts", recovered.Load())
			}
			failed := 0
			for _, s := range o.named("process " + q) {
				if s.Status().Code.String() == "Error" {
					failed++
				}
			}
			if want := map[bool]int{false: 1, true: 0}[tt.recover]; failed != want {
				t.Errorf("%d process spans with status Error, want %d", failed, want)
			}
		})
	}
}

// A recoverer's own error is user code too: when its Error method panics,
// Recover notes the failed recovery on the span with the guarded text, and
// the message is requeued and recovered later, not turned into a panic.
func TestRecovererErrorWhoseErrorPanics(t *testing.T) {
	var onlyError *errorPanicsOnly
	o := observe(t)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "m"})
	var recoveries atomic.Int32
	mw := middleware.Recover(middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error {
		if recoveries.Add(1) == 1 {
			return onlyError
		}
		return nil
	}))
	r := start(t, q, mw, func(context.Context, *amqp.Delivery) error { return errors.New("down") },
		append(o.options(), listener.WithRequeueDelay(10*time.Millisecond, 10*time.Millisecond))...)
	brokertest.Eventually(t, 10*time.Second, "recovered on the second delivery", func() bool { return r.Stats().Handled == 1 })
	r.Stop(t)
	noted := false
	for _, s := range o.named("process " + q) {
		for _, e := range s.Events() {
			for _, a := range e.Attributes {
				if e.Name == "recovery" && string(a.Key) == telemetry.KeyExceptionMessage &&
					strings.Contains(a.Value.AsString(), "its Error method panicked") {
					noted = true
				}
			}
		}
	}
	if !noted {
		t.Error("no recovery event names the recoverer's error as one whose Error method panicked")
	}
}

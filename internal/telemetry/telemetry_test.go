package telemetry_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/telemetry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTableCarrierRoundTrip(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("t").Start(context.Background(), "send")
	defer span.End()
	prop := propagation.TraceContext{}
	headers := amqp.Table{"tenant": "acme"}
	prop.Inject(ctx, telemetry.TableCarrier(headers))
	if _, ok := headers["traceparent"].(string); !ok {
		t.Fatalf("no traceparent written: %v", headers)
	}
	if err := headers.Validate(); err != nil {
		t.Fatalf("the injected headers are not valid AMQP: %v", err)
	}
	got := trace.SpanContextFromContext(prop.Extract(context.Background(), telemetry.TableCarrier(headers)))
	if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() {
		t.Errorf("extracted %v, want %v", got, span.SpanContext())
	}
	// Bytes are read too; other types read as absent.
	headers["traceparent"] = []byte(headers["traceparent"].(string))
	if !trace.SpanContextFromContext(prop.Extract(context.Background(), telemetry.TableCarrier(headers))).IsValid() {
		t.Error("a traceparent written as bytes is not read")
	}
	headers["traceparent"] = int64(7)
	if trace.SpanContextFromContext(prop.Extract(context.Background(), telemetry.TableCarrier(headers))).IsValid() {
		t.Error("a traceparent of the wrong type must read as absent")
	}
	if len(telemetry.TableCarrier(headers).Keys()) != 2 {
		t.Error("Keys")
	}
}

func TestAttrsAreCached(t *testing.T) {
	tel := telemetry.New(telemetry.Config{})
	a := tel.Attrs("outcome", "succeeded", "queue", "orders")
	if allocs := testing.AllocsPerRun(100, func() { _ = tel.Attrs("outcome", "succeeded", "queue", "orders") }); allocs > 0 {
		t.Errorf("Attrs allocates %v times per call once cached", allocs)
	}
	if b := tel.Attrs("outcome", "succeeded", "queue", "orders"); a != b {
		t.Error("a second Attrs for the same pairs")
	}
	if v, _ := a.Set.Value("queue"); v.AsString() != "orders" {
		t.Errorf("set = %v", a.Set)
	}
	counter := tel.Attempts
	if allocs := testing.AllocsPerRun(100, func() { counter.Add(context.Background(), 1, a.Add...) }); allocs > 0 {
		t.Errorf("Add with cached options allocates %v times (no-op provider)", allocs)
	}
}

func TestTracingNoticesANoopTracer(t *testing.T) {
	ctx := context.Background()
	noop := telemetry.New(telemetry.Config{TracerProvider: tracenoop.NewTracerProvider()})
	if !noop.Tracing(ctx) {
		t.Fatal("before any span, tracing must be tried")
	}
	_, span := noop.Tracer.Start(ctx, "root")
	noop.ObserveRoot(span)
	if noop.Tracing(ctx) {
		t.Error("after a no-op root span, root spans should be skipped for a while")
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	defer tp.Shutdown(ctx)
	sdk := telemetry.New(telemetry.Config{TracerProvider: tp})
	_, span = sdk.Tracer.Start(ctx, "root")
	sdk.ObserveRoot(span)
	if !sdk.Tracing(ctx) {
		t.Error("an SDK that samples nothing still traces: its spans have valid contexts")
	}
}

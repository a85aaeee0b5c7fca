package middleware_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/amqpretry/amqpretry/middleware"
)

// The span of a first attempt that failed is recorded only once it has
// failed, but from when the attempt began, and for as long as it ran.
func TestFailedFirstAttemptSpanStartsWithTheAttempt(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	const took = 20 * time.Millisecond
	var firstCall time.Time
	h := func(context.Context, *amqp.Delivery) error {
		if firstCall.IsZero() {
			firstCall = time.Now()
			time.Sleep(took)
			return errBoom
		}
		return nil
	}
	retry := middleware.Retry(2, middleware.WithInitialInterval(time.Millisecond), middleware.WithTracerProvider(tp))
	ctx, process := tp.Tracer("test").Start(context.Background(), "process")
	before := time.Now()
	if err := retry(h)(ctx, &amqp.Delivery{}); err != nil {
		t.Fatal(err)
	}
	process.End()

	var first sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "attempt" && first == nil {
			first = s
		}
	}
	if first == nil {
		t.Fatal("no span for the failed first attempt")
	}
	if start := first.StartTime(); start.Before(before) || start.After(firstCall) {
		t.Errorf("the first attempt's span starts at %v, want between %v (before the chain ran) and %v (the handler's call)", start, before, firstCall)
	}
	if d := first.EndTime().Sub(first.StartTime()); d < took {
		t.Errorf("the first attempt's span lasts %v, but the handler took %v", d, took)
	}
}

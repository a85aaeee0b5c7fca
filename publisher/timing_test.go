package publisher_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/publisher"
)

// A confirm that never comes fails the publish after WithConfirmTimeout when
// the caller's context has no deadline, and at the context's deadline when
// that comes first (await then starts no timer of its own).
func TestConfirmTimeoutAndContextDeadline(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	p := newPublisher(t, url, publisher.WithConfirmTimeout(300*time.Millisecond))
	t.Cleanup(func() { proxy.Blackhole(false) }) // before the publisher's Close, which runs later

	proxy.Blackhole(true) // the publish goes out, no confirm comes back
	began := time.Now()
	err := p.Publish(context.Background(), "", q, amqp.Publishing{Body: []byte("a")})
	took := time.Since(began)
	if !errors.Is(err, publisher.ErrNotConfirmed) || !strings.Contains(err.Error(), "WithConfirmTimeout") {
		t.Fatalf("Publish with no deadline = %v, want ErrNotConfirmed naming WithConfirmTimeout", err)
	}
	if took < 300*time.Millisecond || took > 5*time.Second {
		t.Errorf("gave up after %v, want about the 300ms confirm timeout", took)
	}

	proxy.Blackhole(false)
	long := newPublisher(t, url, publisher.WithConfirmTimeout(time.Minute))
	if err := long.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole(true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = long.Publish(ctx, "", q, amqp.Publishing{Body: []byte("b")})
	if !errors.Is(err, publisher.ErrNotConfirmed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish with a 300ms deadline = %v, want ErrNotConfirmed wrapping the deadline", err)
	}
}

// With a tracer that records nothing the publisher starts no spans, but
// still writes the caller's baggage into the message, on every publish; with
// an SDK it makes one PRODUCER span per publish.
func TestSpansOnlyForARecordingTracerBaggageAlways(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	member, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	ctx := baggage.ContextWithBaggage(ctxTimeout(t, 10*time.Second), bag)

	quiet := newPublisher(t, brokertest.URL(), publisher.WithTracerProvider(noop.NewTracerProvider()),
		publisher.WithPropagators(propagation.Baggage{}))
	for range 2 { // the second after the tracer is known to record nothing
		if err := quiet.Publish(ctx, "", q, amqp.Publishing{}); err != nil {
			t.Fatal(err)
		}
	}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for i := range 2 {
		d, ok := brokertest.Get(t, ch, q)
		if !ok {
			t.Fatalf("message %d is not on the queue", i)
		}
		if got := d.Headers["baggage"]; got != "tenant=acme" {
			t.Errorf("message %d: baggage header %v, want tenant=acme", i, got)
		}
	}

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	traced := newPublisher(t, brokertest.URL(), publisher.WithTracerProvider(tp))
	for range 2 {
		if err := traced.Publish(ctx, "", q, amqp.Publishing{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(spans.Ended()); got != 2 {
		t.Fatalf("%d spans for 2 publishes, want 2", got)
	}
	for _, s := range spans.Ended() {
		if s.Name() != "send amq.default" {
			t.Errorf("span %q, want send amq.default", s.Name())
		}
	}
}

package recoverer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The per-error policy of the issue end to end, through a listener on the
// broker: a timeout gets its 4 quick attempts and then the DLQ, a
// validation error none and goes to a queue of its own, a fraud goes to its
// own queue too, a timeout that clears is acked; each dead letter names the
// rule that applied and counts the attempts, and so do the attempt spans.
func TestPerErrorPoliciesThroughTheListener(t *testing.T) {
	work, dlx, dlq := topology(t)
	fraudQ, invalidQ := brokertest.Name(t, "fraud"), brokertest.Name(t, "invalid")
	brokertest.Queue(t, fraudQ, nil)
	brokertest.Queue(t, invalidQ, nil)
	pub := newPublisher(t, brokertest.URL())
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	fast := middleware.WithInitialInterval(time.Millisecond)
	chain := middleware.Chain(
		middleware.Retry(2, fast,
			middleware.RetryOn(timeouts, 4, fast),
			middleware.NoRetryOn(invalid),
			middleware.NoRetryOn(fraud)),
		middleware.Recover(recoverer.ByError(recoverer.Republish(pub, dlx, work),
			recoverer.When(fraud, recoverer.Republish(pub, "", fraudQ)),
			recoverer.When(invalid, recoverer.Republish(pub, "", invalidQ)))),
	)
	var mu sync.Mutex
	calls := map[string]int{}
	handle := func(ctx context.Context, d *amqp.Delivery) error {
		mu.Lock()
		calls[d.MessageId]++
		n := calls[d.MessageId]
		mu.Unlock()
		switch d.MessageId {
		case "timeout":
			return errTimeout
		case "clears":
			if n < 3 {
				return errTimeout
			}
		case "validation":
			return errValidation
		case "fraud":
			return errFraud
		}
		return nil
	}
	l, err := listener.New(work, chain, handle, listener.WithURL(brokertest.URL()), listener.WithLogger(quiet), listener.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	defer stop()

	var msgs []amqp.Publishing
	for _, id := range []string{"timeout", "clears", "validation", "fraud", "ok"} {
		msgs = append(msgs, amqp.Publishing{MessageId: id, Body: []byte(id)})
	}
	brokertest.Publish(t, work, msgs...)
	brokertest.Eventually(t, 20*time.Second, "one dead letter in each of the DLQ, the fraud queue and the validation queue", func() bool {
		return brokertest.Depth(t, dlq) == 1 && brokertest.Depth(t, fraudQ) == 1 && brokertest.Depth(t, invalidQ) == 1
	})
	brokertest.Eventually(t, 10*time.Second, "the work queue settled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls["ok"] == 1 && calls["clears"] == 3 && brokertest.Depth(t, work) == 0
	})
	stop()

	mu.Lock()
	want := map[string]int{"timeout": 4, "clears": 3, "validation": 1, "fraud": 1, "ok": 1}
	for id, n := range want {
		if calls[id] != n {
			t.Errorf("%s: handled %d times, want %d", id, calls[id], n)
		}
	}
	mu.Unlock()

	ch := brokertest.Channel(t, brokertest.Dial(t))
	for _, tt := range []struct {
		queue, id, rule, message string
		attempts                 int64
	}{
		{dlq, "timeout", "timeout", errTimeout.Error(), 4},
		{fraudQ, "fraud", "fraud", errFraud.Error(), 1},
		{invalidQ, "validation", "validation", errValidation.Error(), 1},
	} {
		d, ok := brokertest.Get(t, ch, tt.queue)
		if !ok {
			t.Fatalf("nothing on %s", tt.queue)
		}
		h := d.Headers
		if d.MessageId != tt.id || h["x-amqpretry-retry-rule"] != tt.rule || h["x-amqpretry-attempts"] != tt.attempts ||
			h[recoverer.HeaderExceptionMessage] != tt.message || h["x-amqpretry-original-queue"] != work {
			t.Errorf("%s holds %s with rule %v, attempts %v, message %v, from %v; want %s with rule %s, %d attempts, message %q, from %s",
				tt.queue, d.MessageId, h["x-amqpretry-retry-rule"], h["x-amqpretry-attempts"], h[recoverer.HeaderExceptionMessage], h["x-amqpretry-original-queue"],
				tt.id, tt.rule, tt.attempts, tt.message, work)
		}
	}

	// The attempt spans of the timeout name its rule: 4 attempts, the last
	// recovered.
	rules := map[string]int{}
	for _, s := range spans.Ended() {
		if s.Name() != "attempt" {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == attribute.Key(middleware.AttrRetryRule) {
				rules[a.Value.AsString()]++
			}
		}
	}
	if rules["timeout"] != 4+2 { // the timeout's 4, and the 2 failures of the one that cleared
		t.Errorf("attempt spans by rule: %v, want 6 under timeout", rules)
	}
}

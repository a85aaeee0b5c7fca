package typed_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
	"github.com/amqpretry/amqpretry/typed"
)

// On the broker, through a listener whose chain retries 5 times: a body
// that does not decode and a content type the handler does not take each
// reach the DLQ after one attempt, the decode error in
// x-exception-message; a good order is handled once.
func TestUndecodableMessagesGoToTheDLQAtOnce(t *testing.T) {
	work, dlq := brokertest.Name(t, "work"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, work, nil)
	brokertest.Queue(t, dlq, nil)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	brokertest.Dial(t)
	pub, err := publisher.New(brokertest.URL(), publisher.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	var mu sync.Mutex
	attempts := map[string]int{} // by message id, counted inside Retry
	var handled []order
	counting := func(next middleware.Handler) middleware.Handler {
		return func(ctx context.Context, d *amqp.Delivery) error {
			mu.Lock()
			attempts[d.MessageId]++
			mu.Unlock()
			return next(ctx, d)
		}
	}
	chain := middleware.Chain(
		middleware.Retry(5, middleware.WithInitialInterval(time.Millisecond)),
		middleware.Recover(recoverer.Republish(pub, "", dlq)),
		counting,
	)
	h := typed.Handler(func(_ context.Context, o order, _ *amqp.Delivery) error {
		mu.Lock()
		handled = append(handled, o)
		mu.Unlock()
		return nil
	})
	l, err := listener.New(work, chain, h, listener.WithURL(brokertest.URL()), listener.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	brokertest.Publish(t, work,
		amqp.Publishing{MessageId: "truncated", ContentType: "application/json", Body: []byte(`{"id":"o-1","total":`)},
		amqp.Publishing{MessageId: "csv", ContentType: "text/csv", Body: []byte("o-2,7")},
		amqp.Publishing{MessageId: "good", ContentType: "application/json", Body: []byte(`{"id":"o-3","total":9}`)},
	)
	brokertest.Eventually(t, 15*time.Second, "two dead letters and the good order handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return brokertest.Depth(t, dlq) == 2 && len(handled) == 1
	})
	mu.Lock()
	if want := map[string]int{"truncated": 1, "csv": 1, "good": 1}; len(attempts) != 3 || attempts["truncated"] != 1 || attempts["csv"] != 1 || attempts["good"] != 1 {
		t.Errorf("attempts %v, want %v", attempts, want)
	}
	if handled[0] != (order{"o-3", 9}) {
		t.Errorf("handled %+v", handled)
	}
	mu.Unlock()

	ch := brokertest.Channel(t, brokertest.Dial(t))
	want := map[string]struct {
		message, errorType string
	}{
		"truncated": {`typed: cannot decode the body (content type "application/json") into typed_test.order: unexpected end of JSON input`, "*json.SyntaxError"},
		"csv":       {`typed: cannot decode the body into typed_test.order: content type "text/csv" is none this handler takes (application/json, +json)`, "*typed.ContentTypeError"},
	}
	for range 2 {
		d, ok := brokertest.Get(t, ch, dlq)
		if !ok {
			t.Fatal("the DLQ is empty")
		}
		w, known := want[d.MessageId]
		if !known {
			t.Fatalf("unexpected dead letter %s", d.MessageId)
		}
		if got := d.Headers[recoverer.HeaderExceptionMessage]; got != w.message {
			t.Errorf("%s: x-exception-message %q, want %q", d.MessageId, got, w.message)
		}
		if got := d.Headers["x-amqpretry-attempts"]; got != int64(1) {
			t.Errorf("%s: x-amqpretry-attempts %v, want 1", d.MessageId, got)
		}
		if got := d.Headers["x-amqpretry-error-type"]; got != w.errorType {
			t.Errorf("%s: x-amqpretry-error-type %v, want %s", d.MessageId, got, w.errorType)
		}
		if body := map[string]string{"truncated": `{"id":"o-1","total":`, "csv": "o-2,7"}[d.MessageId]; string(d.Body) != body {
			t.Errorf("%s: the dead letter's body is %q, want %q", d.MessageId, d.Body, body)
		}
	}
}

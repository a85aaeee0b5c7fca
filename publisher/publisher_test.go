package publisher_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/publisher"
)

func newPublisher(t *testing.T, url string, opts ...publisher.Option) *publisher.Publisher {
	t.Helper()
	brokertest.Dial(t) // fail, or skip outside make test, when there is no broker
	opts = append([]publisher.Option{publisher.WithLogger(slog.New(slog.NewTextHandler(testWriter{t}, nil)))}, opts...)
	p, err := publisher.New(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestPublishConfirmed(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, brokertest.URL())

	msg := amqp.Publishing{
		MessageId: "m1", ContentType: "application/json", Body: []byte(`{"id":1}`),
		Headers: amqp.Table{"big": 1 << 40, "nested": amqp.Table{"n": 7}},
	}
	if err := p.Publish(ctxTimeout(t, 5*time.Second), "", q, msg); err != nil {
		t.Fatal(err)
	}
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), q)
	if !ok {
		t.Fatal("the confirmed message is not on the queue")
	}
	if d.MessageId != "m1" || string(d.Body) != `{"id":1}` {
		t.Errorf("got %+v", d)
	}
	if d.Headers["big"] != int64(1<<40) {
		t.Errorf("header big = %#v, want int64 1<<40: a Go int must not be cut to 32 bits", d.Headers["big"])
	}
	if n := d.Headers["nested"].(amqp.Table)["n"]; n != int64(7) {
		t.Errorf("nested header = %#v", n)
	}
	if p.FrameMax() != 131072 {
		t.Errorf("FrameMax = %d, want RabbitMQ's default 131072", p.FrameMax())
	}
}

func TestPublishUnroutable(t *testing.T) {
	p := newPublisher(t, brokertest.URL())
	err := p.Publish(ctxTimeout(t, 5*time.Second), "amq.direct", brokertest.Name(t, "nobody-binds-this"), amqp.Publishing{Body: []byte("x")})
	var ue *publisher.UnroutableError
	if !errors.Is(err, publisher.ErrUnroutable) || !errors.As(err, &ue) || ue.ReplyCode != 312 || ue.Exchange != "amq.direct" {
		t.Fatalf("err = %v, want ErrUnroutable with reply 312 NO_ROUTE from amq.direct", err)
	}
}

func TestPublishMissingExchangeThenNextWorks(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, brokertest.URL(), publisher.WithChannels(1))
	missing := brokertest.Name(t, "no-such-exchange")

	err := p.Publish(ctxTimeout(t, 5*time.Second), missing, "k", amqp.Publishing{Body: []byte("x")})
	var nf *publisher.ExchangeNotFoundError
	if !errors.As(err, &nf) || nf.Exchange != missing || !strings.Contains(err.Error(), missing) {
		t.Fatalf("err = %v, want an ExchangeNotFoundError naming %s", err, missing)
	}
	for i := range 3 {
		if err := p.Publish(ctxTimeout(t, 5*time.Second), "", q, amqp.Publishing{Body: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatalf("publish %d after the channel exception: %v", i, err)
		}
	}
	if n := brokertest.Depth(t, q); n != 3 {
		t.Fatalf("queue holds %d messages, want 3", n)
	}
}

func TestPublishNacked(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"})
	p := newPublisher(t, brokertest.URL())
	ctx := ctxTimeout(t, 5*time.Second)
	if err := p.Publish(ctx, "", q, amqp.Publishing{Body: []byte("fits")}); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctx, "", q, amqp.Publishing{Body: []byte("overflows")}); !errors.Is(err, publisher.ErrNacked) {
		t.Fatalf("err = %v, want ErrNacked from a full reject-publish queue", err)
	}
}

func TestPublishInvalidHeadersSendNothing(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, brokertest.URL())
	err := p.Publish(ctxTimeout(t, 5*time.Second), "", q, amqp.Publishing{Headers: amqp.Table{"bad": struct{}{}}})
	if err == nil || !strings.Contains(err.Error(), `"bad"`) {
		t.Fatalf("err = %v, want an error naming the bad header", err)
	}
	if n := brokertest.Depth(t, q); n != 0 {
		t.Fatalf("queue holds %d messages, want none", n)
	}
}

// Routable and unroutable publishes interleaved on shared channels: each
// caller gets its own outcome, never its neighbour's.
func TestConcurrentOutcomesAreNotMixedUp(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Bind(t, q, "amq.direct", q)
	p := newPublisher(t, brokertest.URL(), publisher.WithChannels(2))
	unbound := brokertest.Name(t, "unbound")

	const perWorker, workers = 100, 16
	var routed, returned, wrong sync.Map
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				id := fmt.Sprintf("%d-%d", w, i)
				key := q
				if i%2 == 1 {
					key = unbound
				}
				err := p.Publish(ctxTimeout(t, 10*time.Second), "amq.direct", key, amqp.Publishing{MessageId: id, Body: []byte(id)})
				switch {
				case key == q && err == nil:
					routed.Store(id, true)
				case key == unbound && errors.Is(err, publisher.ErrUnroutable):
					returned.Store(id, true)
				default:
					wrong.Store(id, err)
				}
			}
		}()
	}
	wg.Wait()
	wrong.Range(func(k, v any) bool { t.Errorf("message %v: key/outcome mismatch: %v", k, v); return true })
	if n := brokertest.Depth(t, q); n != workers*perWorker/2 {
		t.Fatalf("queue holds %d, want %d", n, workers*perWorker/2)
	}
}

func TestPublishWaitsForTheBrokerUntilTheDeadline(t *testing.T) {
	proxy, url := brokertest.Proxy(t)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, url)

	proxy.Refuse(true)
	proxy.CutAll()
	start := time.Now()
	err := p.Publish(ctxTimeout(t, time.Second), "", q, amqp.Publishing{Body: []byte("during the outage")})
	if !errors.Is(err, publisher.ErrNotConfirmed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrNotConfirmed after the deadline", err)
	}
	if !errors.Is(err, publisher.ErrNotConnected) {
		t.Errorf("err = %v, want it to match ErrNotConnected: the outage, not the message, is at fault", err)
	}
	if waited := time.Since(start); waited < 900*time.Millisecond || waited > 3*time.Second {
		t.Errorf("returned after %v, want about the 1s deadline", waited)
	}

	// A publish that starts during the outage succeeds once the broker is back.
	done := make(chan error, 1)
	go func() {
		done <- p.Publish(ctxTimeout(t, 20*time.Second), "", q, amqp.Publishing{Body: []byte("after")})
	}()
	time.Sleep(300 * time.Millisecond)
	proxy.Refuse(false)
	if err := <-done; err != nil {
		t.Fatalf("publish across the outage: %v", err)
	}
	if n := brokertest.Depth(t, q); n != 1 {
		t.Fatalf("queue holds %d, want only the confirmed message", n)
	}

	// Connected, a context that ends is not an outage.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	err = p.Publish(cancelled, "", q, amqp.Publishing{Body: []byte("cancelled")})
	if !errors.Is(err, publisher.ErrNotConfirmed) || errors.Is(err, publisher.ErrNotConnected) {
		t.Fatalf("connected, cancelled: err = %v, want ErrNotConfirmed and not ErrNotConnected", err)
	}
}

func TestCloseAndAfter(t *testing.T) {
	p := newPublisher(t, brokertest.URL())
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.Publish(context.Background(), "", "q", amqp.Publishing{}); !errors.Is(err, publisher.ErrClosed) {
		t.Fatalf("Publish after Close = %v, want ErrClosed", err)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	tests := []struct {
		name string
		url  string
		opts []publisher.Option
		want string
	}{
		{"scheme", "http://u:hunter2@localhost/", nil, "invalid AMQP URL"},
		{"port", "amqp://u:hunter2@localhost:notaport/", nil, "invalid AMQP URL"},
		{"channels", brokertest.URL(), []publisher.Option{publisher.WithChannels(0)}, "WithChannels expects 1 to 256 channels, got 0"},
		{"confirm timeout", brokertest.URL(), []publisher.Option{publisher.WithConfirmTimeout(0)}, "WithConfirmTimeout expects a duration > 0, got 0s"},
		{"heartbeat", brokertest.URL(), []publisher.Option{publisher.WithHeartbeat(time.Millisecond)}, "WithHeartbeat expects at least 1s, got 1ms"},
		{"logger", brokertest.URL(), []publisher.Option{publisher.WithLogger(nil)}, "WithLogger expects a non-nil logger"},
		{"TLS with amqp://", "amqp://u:hunter2@127.0.0.1:1/", []publisher.Option{publisher.WithTLS(&tls.Config{})}, "WithTLS: amqp://u:xxxxx@127.0.0.1:1/ is amqp://, which never uses TLS"},
		{"unreachable", "amqp://u:hunter2@127.0.0.1:1/", nil, "cannot connect to amqp://u:xxxxx@127.0.0.1:1/"},
		{"access refused", brokertest.WithCredentials("guest", "wrong-hunter2"), nil, "cannot connect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := publisher.New(tt.url, tt.opts...)
			if err == nil {
				p.Close()
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("err leaks the password: %v", err)
			}
		})
	}
}

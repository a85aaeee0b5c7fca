package listener_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// WaitReady returns once the broker shows the listener's consumers, and
// Stats says so; after a cut it is not ready until it consumes again; after
// Run returns it says why.
func TestWaitReadyFollowsTheConnection(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	l, err := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(url), listener.WithConcurrentConsumers(3), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Ready || !s.ConnectedSince.IsZero() {
		t.Errorf("before Run: Stats %+v, want not ready, not connected", s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	wait, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if err := l.WaitReady(wait); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	if n := brokertest.Consumers(t, q); n != 3 {
		t.Errorf("ready, but the broker shows %d consumers, want 3", n)
	}
	if s := l.Stats(); !s.Ready || s.ConnectedSince.IsZero() {
		t.Errorf("ready: Stats %+v", s)
	}
	proxy.CutAll()
	brokertest.Eventually(t, 5*time.Second, "not ready after the cut", func() bool { return !l.Stats().Ready })
	if s := l.Stats(); s.LastConnectionError == "" {
		t.Errorf("after the cut: no LastConnectionError in %+v", s)
	}
	if err := l.WaitReady(wait); err != nil {
		t.Fatalf("WaitReady after the cut: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := l.WaitReady(context.Background()); !errors.Is(err, listener.ErrStopped) {
		t.Errorf("WaitReady after Run = %v, want ErrStopped", err)
	}
}

// WithFailFast: a broker that is not there at start-up ends Run at once;
// without it Run waits for the broker (and WaitReady with it). Either way a
// listener without WithURL says which broker it uses.
func TestFailFastAndTheDefaultURL(t *testing.T) {
	proxy, url := brokertest.Proxy(t)
	proxy.Refuse(true)
	l, err := listener.New("q", nil, func(context.Context, *amqp.Delivery) error { return nil }, listener.WithURL(url), listener.WithFailFast(), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	err = l.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "WithFailFast") || time.Since(begin) > 5*time.Second {
		t.Fatalf("Run = %v after %v, want the dial error at once", err, time.Since(begin))
	}
	if err := l.WaitReady(context.Background()); err == nil || !strings.Contains(err.Error(), "WithFailFast") {
		t.Errorf("WaitReady = %v, want Run's error", err)
	}

	var log testlog.Buffer
	l, err = listener.New("q", nil, func(context.Context, *amqp.Delivery) error { return nil }, listener.WithLogger(log.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_ = l.Run(ctx)
	if log.Count("no WithURL or WithURLs: consuming from the default broker\" queue=q url=amqp://guest:xxxxx@127.0.0.1:5672/") != 1 {
		t.Errorf("a listener without WithURL does not say which broker it uses (%d, %d):\n%s", log.Count("no WithURL or WithURLs"), log.Count("guest:xxxxx@127.0.0.1:5672"), log.String())
	}
}

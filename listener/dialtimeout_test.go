package listener_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
)

// A broker that accepts the connection and then says nothing (a frozen
// node, a half-open partition): WithDialTimeout bounds each dial, so
// WithFailFast fails in about that time rather than the 10 s default, and
// while a dial is pending LastConnectionError already says what is going on.
func TestDialTimeoutAgainstAFrozenBroker(t *testing.T) {
	handle := func(context.Context, *amqp.Delivery) error { return nil }

	t.Run("fail fast", func(t *testing.T) {
		proxy, url := brokertest.Proxy(t)
		proxy.Blackhole(true)
		l, err := listener.New("q", nil, handle, listener.WithURL(url), listener.WithFailFast(), listener.WithDialTimeout(500*time.Millisecond), logTo(t, false))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- l.Run(context.Background()) }()
		select {
		case err := <-done:
			if err == nil {
				t.Error("Run returned nil against a frozen broker with WithFailFast")
			}
		case <-time.After(5 * time.Second): // the default dial timeout is 10s
			proxy.Blackhole(false)
			<-done
			t.Fatal("Run did not fail within 5s with WithDialTimeout(500ms)")
		}
	})

	t.Run("pending dial shows", func(t *testing.T) {
		proxy, url := brokertest.Proxy(t)
		proxy.Blackhole(true)
		r := start(t, "q", nil, handle, listener.WithURL(url), listener.WithDialTimeout(time.Minute))
		brokertest.Eventually(t, 5*time.Second, "LastConnectionError while the dial is pending", func() bool {
			return strings.Contains(r.Stats().LastConnectionError, "no answer")
		})
		proxy.Blackhole(false)
	})

	t.Run("bad value", func(t *testing.T) {
		_, err := listener.New("q", nil, handle, listener.WithDialTimeout(0))
		if err == nil || !strings.Contains(err.Error(), "WithDialTimeout") {
			t.Errorf("New = %v, want WithDialTimeout named", err)
		}
	})
}

package publisher_test

import (
	"strings"
	"testing"
	"time"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/publisher"
)

// A broker that accepts the connection and then says nothing: New's first
// dial gives up after WithDialTimeout, not the 10 s default.
func TestNewWithDialTimeoutAgainstAFrozenBroker(t *testing.T) {
	proxy, url := brokertest.Proxy(t)
	proxy.Blackhole(true)
	defer proxy.Blackhole(false)
	done := make(chan error, 1)
	go func() {
		p, err := publisher.New(url, publisher.WithDialTimeout(500*time.Millisecond))
		if err == nil {
			_ = p.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("New succeeded against a frozen broker")
		}
	case <-time.After(5 * time.Second): // the default dial timeout is 10s
		proxy.Blackhole(false)
		<-done
		t.Fatal("New did not fail within 5s with WithDialTimeout(500ms)")
	}
	if _, err := publisher.New(url, publisher.WithDialTimeout(time.Millisecond)); err == nil || !strings.Contains(err.Error(), "WithDialTimeout") {
		t.Errorf("New = %v, want WithDialTimeout named", err)
	}
}

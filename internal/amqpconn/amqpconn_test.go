package amqpconn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A publish stuck in a socket write, then a heartbeat timeout: without
// Abandon, amqp091's shutdown and the write wait for each other forever.
func TestAbandonFreesAStuckWrite(t *testing.T) {
	brokertest.Dial(t)
	proxy, err := faultproxy.Start("127.0.0.1:5672")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	url, _ := proxy.URL(brokertest.URL())
	conn, err := amqpconn.Dial(url, amqp.Config{Heartbeat: time.Second}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole(true)
	defer proxy.Blackhole(false)
	stuck := make(chan error, 1)
	go func() {
		stuck <- ch.Publish("", "nowhere", false, false, amqp.Publishing{Body: make([]byte, 8<<20)})
	}()
	select {
	case <-stuck:
		t.Fatal("the write did not block: the test proves nothing")
	case <-time.After(4 * time.Second): // past the heartbeat timeout
	}
	conn.Abandon()
	select {
	case err := <-stuck:
		if err == nil {
			t.Fatal("the write succeeded on an abandoned socket")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Abandon did not free the stuck write")
	}
	if !conn.IsClosed() {
		t.Error("the connection is not closed after Abandon")
	}
}

func TestDialContextGivesUpWhenCancelled(t *testing.T) {
	brokertest.Dial(t)
	proxy, err := faultproxy.Start("127.0.0.1:5672")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxy.Blackhole(true) // TCP connects, the handshake never answers
	defer proxy.Blackhole(false)
	url, _ := proxy.URL(brokertest.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err = amqpconn.DialContext(ctx, url, amqp.Config{}, 10*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(begin) > 2*time.Second {
		t.Fatalf("DialContext = %v after %v, want the context's error at once", err, time.Since(begin))
	}
}

package reliability

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The broker stops answering without closing anything (a hung broker, a
// partition). The listener and the publisher notice within about two
// heartbeat intervals, redial once the path heals, and lose nothing.
func TestBlackHole(t *testing.T) {
	brokertest.Dial(t)
	proxy, url := brokertest.Proxy(t)
	const heartbeat = 2 * time.Second
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, q, nil)
	brokertest.Queue(t, dlq, nil)

	book := newLogBook()
	pub, err := publisher.New(url, publisher.WithHeartbeat(heartbeat), publisher.WithLogger(book.logger()))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var mu sync.Mutex
	handled := map[string]int{}
	l, _ := listener.New(q, middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(50*time.Millisecond)), middleware.Recover(recoverer.Republish(pub, "", dlq))),
		func(_ context.Context, d *amqp.Delivery) error {
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			handled[d.MessageId]++
			if d.MessageId == "poison" {
				return errors.New("poison")
			}
			return nil
		}, listener.WithURL(url), listener.WithHeartbeat(heartbeat), listener.WithLogger(book.logger()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	const n = 400
	msgs := []amqp.Publishing{{MessageId: "poison"}}
	for i := range n {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprint(i), DeliveryMode: amqp.Persistent})
	}
	brokertest.Publish(t, q, msgs...)
	distinct := func() int { mu.Lock(); defer mu.Unlock(); return len(handled) }
	brokertest.Eventually(t, 10*time.Second, "consuming", func() bool { return distinct() > 50 })

	holed := time.Now()
	proxy.Blackhole(true)
	brokertest.Eventually(t, 15*time.Second, "both to notice the silence", func() bool {
		_, l := book.first("listener: connection problem", holed)
		_, p := book.first("publisher: connection lost", holed)
		return l && p
	})
	lAt, _ := book.first("listener: connection problem", holed)
	pAt, _ := book.first("publisher: connection lost", holed)
	t.Logf("noticed after %v (listener) and %v (publisher), heartbeat %v", lAt.Sub(holed), pAt.Sub(holed), heartbeat)
	for who, at := range map[string]time.Time{"listener": lAt, "publisher": pAt} {
		if took := at.Sub(holed); took > 2*heartbeat+time.Second {
			t.Errorf("the %s took %v to notice, want about two heartbeats (%v)", who, took, 2*heartbeat)
		}
	}
	proxy.Blackhole(false) // the partition heals: redial, resume

	brokertest.Eventually(t, 30*time.Second, "every message handled, the poison one on the DLQ", func() bool {
		return distinct() == n+1 && brokertest.Depth(t, dlq) == 1 && brokertest.Depth(t, q) == 0
	})
	dups := 0
	mu.Lock()
	for id, c := range handled {
		if id != "poison" {
			dups += c - 1
		}
	}
	mu.Unlock()
	t.Logf("%d messages, none lost; %d handled twice (in flight when the connection went silent)", n+1, dups)
}

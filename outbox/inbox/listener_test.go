package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// The inbox behind the listener and Chain(Retry, Recover) on the real
// broker: duplicates are acked without a second effect, a panic is rolled
// back and retried, a message without an id goes to the recoverer at once,
// and the queue ends empty.
func TestWithListenerRetryAndRecover(t *testing.T) {
	ib, db, schema := setup(t)
	q := brokertest.Name(t, "orders")
	brokertest.Queue(t, q, nil)

	var mu sync.Mutex
	panicked := map[string]bool{}
	handle := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+schema+`.effects (message_id, note) VALUES ($1, $2)`,
			d.MessageId, fmt.Sprint("attempt ", middleware.Attempt(ctx))); err != nil {
			return err
		}
		mu.Lock()
		first := string(d.Body) == "panic" && !panicked[d.MessageId]
		panicked[d.MessageId] = true
		mu.Unlock()
		if first {
			panic("a bug on the first attempt")
		}
		return nil
	})
	recovered := make(chan error, 10)
	l, err := listener.New(q,
		middleware.Chain(
			middleware.Retry(3, middleware.WithInitialInterval(10*time.Millisecond)),
			middleware.Recover(middleware.RecovererFunc(func(_ context.Context, _ *amqp.Delivery, cause error) error {
				recovered <- cause
				return nil
			})),
		),
		handle,
		listener.WithURL(brokertest.URL()),
		listener.WithConcurrentConsumers(4),
		listener.WithLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	ch := brokertest.Channel(t, brokertest.Dial(t))
	send := func(id, body string) {
		if err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{MessageId: id, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	const orders = 30
	for i := range orders {
		send(fmt.Sprint("order-", i), "ok")
		if i%3 == 0 {
			send(fmt.Sprint("order-", i), "ok") // the broker's at-least-once
		}
	}
	send("order-panics", "panic")
	send("", "no id")

	select {
	case cause := <-recovered:
		if !middleware.IsPermanent(cause) {
			t.Errorf("recovered %v, want the Permanent missing-id error", cause)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the message without an id never reached the recoverer")
	}
	deadline := time.Now().Add(20 * time.Second)
	for count(t, db, `SELECT count(*) FROM `+schema+`.effects`) < orders+1 || brokertest.Depth(t, q) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d effects, %d messages in the queue", count(t, db, `SELECT count(*) FROM `+schema+`.effects`), brokertest.Depth(t, q))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // unacked duplicates would show now
	if n := count(t, db, `SELECT count(*) FROM (SELECT message_id FROM `+schema+`.effects GROUP BY message_id HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d messages took effect twice", n)
	}
	if n := count(t, db, `SELECT count(*) FROM `+schema+`.effects`); n != orders+1 {
		t.Fatalf("%d effects, want %d", n, orders+1)
	}
	var note string
	if err := db.QueryRow(`SELECT note FROM ` + schema + `.effects WHERE message_id = 'order-panics'`).Scan(&note); err != nil || note != "attempt 2" {
		t.Fatalf("the panicking message took effect on %q (%v), want attempt 2", note, err)
	}
	if len(recovered) != 0 {
		t.Fatalf("%d more messages reached the recoverer: %v", len(recovered), <-recovered)
	}
}

package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/internal/dbtest"
	"github.com/amqpretry/amqpretry/publisher"
)

// The relay publishes through the library's own publisher.
var _ outbox.Publisher = (*publisher.Publisher)(nil)

// fast are options that keep failure tests short.
var fast = []outbox.Option{outbox.WithRetryBackoff(10*time.Millisecond, 40*time.Millisecond)}

// setup returns an Outbox on a table in a schema of the test's own, migrated.
func setup(t testing.TB, opts ...outbox.Option) (*outbox.Outbox, *sql.DB, string) {
	t.Helper()
	db := dbtest.DB(t)
	schema := dbtest.Schema(t, db)
	ob, err := outbox.New(db, append([]outbox.Option{outbox.WithTable(schema + ".outbox"), outbox.WithLogger(testLogger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ob, db, schema
}

// testLogger writes to the test's log, so a failing test shows the relay's story.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func newPublisher(t testing.TB) *publisher.Publisher {
	t.Helper()
	brokertest.Dial(t) // skips or fails clearly without a broker
	pub, err := publisher.New(brokertest.URL(), publisher.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// enqueue writes msg in a transaction of its own and commits it.
func enqueue(t testing.TB, db *sql.DB, ob *outbox.Outbox, exchange, key string, msg amqp.Publishing) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ob.Enqueue(ctx, tx, exchange, key, msg)
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id
}

// queue declares a queue of the test's own, deleted at the end, and
// returns its name and its deliveries (auto-acked).
func queue(t *testing.T) (string, <-chan amqp.Delivery) {
	t.Helper()
	name := brokertest.Name(t, "q")
	brokertest.Queue(t, name, nil)
	ch := brokertest.Channel(t, brokertest.Dial(t))
	deliveries, err := ch.Consume(name, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return name, deliveries
}

// start runs relay until the test ends and checks that Run returned nil.
// The returned function stops it early.
func start(t *testing.T, relay *outbox.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run returned %v, want nil after cancel", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// receive waits for one delivery.
func receive(t *testing.T, deliveries <-chan amqp.Delivery, within time.Duration) amqp.Delivery {
	t.Helper()
	select {
	case d := <-deliveries:
		return d
	case <-time.After(within):
		t.Fatalf("no message within %v", within)
	}
	return amqp.Delivery{}
}

// eventually polls cond until it holds, or fails the test after within.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// row returns the row with id, failing the test if it is not there.
func row(t *testing.T, ob *outbox.Outbox, id int64) outbox.Row {
	t.Helper()
	rows, err := ob.List(context.Background(), outbox.ListOptions{Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.ID == id {
			return r
		}
	}
	t.Fatalf("row %d is not in the table", id)
	return outbox.Row{}
}

func statusOf(t *testing.T, db *sql.DB, ob *outbox.Outbox, id int64) outbox.Status {
	t.Helper()
	var s outbox.Status
	if err := db.QueryRow(`SELECT status FROM `+ob.Table()+` WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// publishModes are the relay's two ways to publish: Publish, a goroutine
// waiting on each confirm (any Publisher), and PublishAsync (a
// *publisher.Publisher).
var publishModes = []struct {
	name  string
	async bool
}{{"Publish", false}, {"PublishAsync", true}}

// relayIn returns ob's relay through pub, publishing with pub's
// PublishAsync when async is set and with its Publish otherwise, whatever
// pub is.
func relayIn(ob *outbox.Outbox, async bool, pub outbox.Publisher, opts ...outbox.Option) *outbox.Relay {
	r := ob.Relay(pub, opts...)
	if async {
		return r.PublishAsyncThrough(pub.(outbox.AsyncPublisher))
	}
	return r.PublishAsyncThrough(nil)
}

package outbox_test

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/internal/dbtest"
	"github.com/amqpretry/amqpretry/publisher"
)

// slowPublisher returns a publisher whose every frame, both ways, waits
// delay in a proxy: a broker slow to confirm.
func slowPublisher(t *testing.T, delay time.Duration) *publisher.Publisher {
	t.Helper()
	proxy, url := brokertest.Proxy(t)
	pub, err := publisher.New(url, publisher.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	proxy.SetLatency(delay) // after the handshake, which takes several round trips
	return pub
}

// countDeliveries counts the deliveries of each message id until the test
// ends; the returned function reads the counts.
func countDeliveries(t *testing.T, deliveries <-chan amqp.Delivery) func() map[string]int {
	t.Helper()
	var mu sync.Mutex
	counts := map[string]int{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case d, ok := <-deliveries:
				if !ok {
					return
				}
				mu.Lock()
				counts[d.MessageId]++
				mu.Unlock()
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { close(done); wg.Wait() })
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]int, len(counts))
		for k, v := range counts {
			out[k] = v
		}
		return out
	}
}

// Finding 1 of issue 26: a broker whose confirms take longer than
// PostgreSQL's idle_in_transaction_session_timeout. A relay that held its
// claiming transaction open while it waited for the confirms lost its
// session on every pass, marked nothing sent and published the batch again,
// for ever. The relay holds no transaction while it waits on the broker:
// every row is marked sent, and published once.
func TestConfirmsSlowerThanIdleInTransactionTimeout(t *testing.T) {
	const rows = 5
	ob, db, schema := setup(t)
	q, deliveries := queue(t)
	// The setting applies to the relay's sessions only (a startup parameter
	// of its connections), never to the server.
	relayDB := dbtest.Open(t, dbtest.URL()+"&idle_in_transaction_session_timeout=1000")
	var timeout string
	if err := relayDB.QueryRow(`SHOW idle_in_transaction_session_timeout`).Scan(&timeout); err != nil || timeout != "1s" {
		t.Fatalf("the relay's sessions have idle_in_transaction_session_timeout %q (%v), want 1s", timeout, err)
	}
	relayOutbox, err := outbox.New(relayDB, outbox.WithTable(schema+".outbox"), outbox.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
	}
	counts := countDeliveries(t, deliveries)
	// 1.5s each way: a confirm comes 3s after its publish.
	start(t, relayOutbox.Relay(slowPublisher(t, 1500*time.Millisecond), outbox.WithPublishTimeout(10*time.Second)))
	eventually(t, 30*time.Second, "every row sent", func() bool {
		var pending int
		_ = db.QueryRow(`SELECT count(*) FROM ` + ob.Table() + ` WHERE status <> 'sent'`).Scan(&pending)
		return pending == 0
	})
	time.Sleep(4 * time.Second) // a publish started just before the marks would arrive by now
	got := counts()
	for i := range rows {
		if n := got["m"+strconv.Itoa(i)]; n != 1 {
			t.Errorf("m%d delivered %d times, want once", i, n)
		}
	}
}

// Finding 2 of issue 26: a relay whose database connection goes silent
// (a frozen process, dropped packets) right after it claimed a row. A
// relay that held the claim as a row lock kept it "idle in transaction"
// until TCP keepalive gave up, hours later, and every healthy relay skipped
// the row. Now the claim is a lease: once it lapses, another relay takes
// the row.
func TestFrozenDatabaseConnectionHoldsRowsOnlyForItsLease(t *testing.T) {
	ob, db, schema := setup(t)
	q, deliveries := queue(t)
	proxy, err := faultproxy.Start(dbtest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	frozenDB := dbtest.Open(t, dbtest.WithHost(t, proxy.Addr(), ""))
	frozenOutbox, err := outbox.New(frozenDB, outbox.WithTable(schema+".outbox"), outbox.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	id := enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "frozen"})

	// The first relay freezes its database connection as it publishes:
	// after its claim, before it can record anything.
	var claimed atomic.Bool
	freezer := &hookPublisher{pub: newPublisher(t), before: func() {
		if claimed.CompareAndSwap(false, true) {
			proxy.Blackhole(true)
		}
	}}
	const lease = 3 * time.Second
	start(t, frozenOutbox.Relay(freezer, outbox.WithLease(lease), outbox.WithPublishTimeout(time.Second)))
	t.Cleanup(func() { proxy.Blackhole(false) }) // before the relay stops (cleanups run last first)
	eventually(t, 10*time.Second, "the first relay claims the row", claimed.Load)
	frozenAt := time.Now()
	receive(t, deliveries, 10*time.Second) // the frozen relay's publish

	// A healthy relay takes the row once the lease lapses.
	start(t, ob.Relay(newPublisher(t)))
	d := receive(t, deliveries, lease+10*time.Second)
	if d.MessageId != "frozen" {
		t.Fatalf("got %q", d.MessageId)
	}
	eventually(t, 5*time.Second, "the row sent by the healthy relay", func() bool { return statusOf(t, db, ob, id) == outbox.StatusSent })
	t.Logf("the healthy relay sent the row %v after the other relay's connection froze (lease %v)", time.Since(frozenAt).Round(time.Millisecond), lease)
}

// Finding 5 of issue 26: Run waits for a pool connection with its
// caller's context. A relay whose claiming transaction outlived the
// caller's context took up to 90 s to return from a cancelled Run while
// the shared *sql.DB was busy.
func TestCancelledRunReturnsWhileThePoolIsBusy(t *testing.T) {
	_, _, schema := setup(t)
	busyDB := dbtest.Open(t, dbtest.URL())
	busyDB.SetMaxOpenConns(1)
	ob, err := outbox.New(busyDB, outbox.WithTable(schema+".outbox"), outbox.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	// The application holds the pool's only connection.
	conn, err := busyDB.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ob.Relay(newPublisher(t)).Run(ctx) }()
	time.Sleep(300 * time.Millisecond) // the relay waits for the connection
	cancel()
	cancelled := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v, want nil after cancel", err)
		}
		t.Logf("Run returned %v after the cancel", time.Since(cancelled).Round(time.Millisecond))
	case <-time.After(3 * time.Second):
		_ = conn.Close() // let it finish, so the test ends
		<-done
		t.Fatalf("Run returned %v after the cancel, want at once", time.Since(cancelled).Round(time.Millisecond))
	}
}

// A trap of issue 26: graceful shutdown abandoned the confirms of the
// publishes in flight, so rows the broker had stored stayed in flight and
// were sent again on restart. Run now waits, up to WithShutdownTimeout, for
// the confirms of what it has sent and records them.
func TestShutdownWaitsForTheConfirmsInFlight(t *testing.T) {
	const rows = 200
	ob, db, _ := setup(t, outbox.WithWorkers(1), outbox.WithBatchSize(rows))
	q, deliveries := queue(t)
	for i := range rows {
		enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
	}
	counts := countDeliveries(t, deliveries)
	ctx, cancel := context.WithCancel(context.Background())
	var started atomic.Int32
	pub := &hookPublisher{pub: slowPublisher(t, 300*time.Millisecond), before: func() {
		if started.Add(1) == rows {
			cancel() // every row of the batch is being published
		}
	}}
	if err := ob.Relay(pub).Run(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // what was sent has reached the queue
	got := counts()
	list, err := ob.List(context.Background(), outbox.ListOptions{Limit: rows})
	if err != nil {
		t.Fatal(err)
	}
	again := 0
	for _, r := range list {
		if r.Status != outbox.StatusSent && got[r.MessageID] > 0 {
			again++
		}
	}
	if again > 0 {
		t.Fatalf("%d of %d rows reached the queue but are %s after the shutdown: a restart sends them again", again, rows, outbox.StatusInFlight)
	}
	t.Logf("%d messages delivered before the shutdown ended, every one marked sent", len(got))
}

// hookPublisher runs before ahead of each publish.
type hookPublisher struct {
	pub    outbox.Publisher
	before func()
}

func (h *hookPublisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	h.before()
	return h.pub.Publish(ctx, exchange, key, msg)
}

func (h *hookPublisher) PublishAsync(ctx context.Context, exchange, key string, msg amqp.Publishing, done func(error)) error {
	h.before()
	return h.pub.(outbox.AsyncPublisher).PublishAsync(ctx, exchange, key, msg, done)
}

package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/internal/dbtest"
)

// confirmRecorder passes publishes to the real publisher and remembers which
// message ids the broker confirmed; hook runs after each confirm.
type confirmRecorder struct {
	pub       outbox.Publisher
	mu        sync.Mutex
	confirmed map[string]int
	hook      func(n int)
}

func (c *confirmRecorder) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	err := c.pub.Publish(ctx, exchange, key, msg)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.confirmed[msg.MessageId]++
	n := 0
	for _, k := range c.confirmed {
		n += k
	}
	c.mu.Unlock()
	if c.hook != nil {
		c.hook(n)
	}
	return nil
}

func (c *confirmRecorder) wasConfirmed(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.confirmed[id] > 0
}

// The database goes away in the middle of a pass: rows were confirmed by the
// broker but the transaction that would mark them sent is cut. The relay
// logs (password hidden), waits, resumes; every row ends up sent, no row is
// lost, and no row is marked sent without a confirm. The rows whose marks
// were lost are sent again: those duplicates are counted and logged, and
// carry the same MessageId for the consumer to drop.
func TestDatabaseGoesAwayMidRelay(t *testing.T) {
	const rows, password = 600, "s3cret-pw-0utb0x"
	ob, db, schema := setup(t)
	q, deliveries := queue(t)

	proxy, err := faultproxy.Start(dbtest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	relayDB := dbtest.Open(t, dbtest.WithHost(t, proxy.Addr(), password))
	logs := &syncBuffer{}
	relayOutbox, err := outbox.New(relayDB, outbox.WithTable(schema+".outbox"), outbox.WithBatchSize(50),
		outbox.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}

	for i := range rows / 2 {
		enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
	}
	var cuts atomic.Int32
	var outage sync.WaitGroup
	rec := &confirmRecorder{pub: newPublisher(t), confirmed: map[string]int{}}
	rec.hook = func(n int) {
		// After the 75th confirm, mid-batch: cut the database for 700ms.
		if n == 75 && cuts.Add(1) == 1 {
			proxy.Refuse(true)
			proxy.CutAll()
			outage.Add(1)
			go func() {
				defer outage.Done()
				time.Sleep(700 * time.Millisecond)
				proxy.Refuse(false)
			}()
		}
	}
	start(t, relayOutbox.Relay(rec))
	for i := rows / 2; i < rows; i++ { // more commits while it happens
		enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
		time.Sleep(time.Millisecond)
	}

	delivered := map[string]int{}
	deadline := time.After(60 * time.Second)
	for len(delivered) < rows {
		select {
		case d := <-deliveries:
			delivered[d.MessageId]++
		case <-deadline:
			t.Fatalf("%d of %d messages delivered", len(delivered), rows)
		}
	}
	eventually(t, 30*time.Second, "every row sent", func() bool {
		var pending int
		_ = db.QueryRow(`SELECT count(*) FROM ` + ob.Table() + ` WHERE status <> 'sent'`).Scan(&pending)
		return pending == 0
	})
	outage.Wait()
	list, err := ob.List(context.Background(), outbox.ListOptions{Limit: rows})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list {
		if !rec.wasConfirmed(r.MessageID) {
			t.Errorf("row %d (%s) is sent, but the broker never confirmed it", r.ID, r.MessageID)
		}
	}
	dups := 0
	for _, n := range delivered {
		dups += n - 1
	}
	t.Logf("%d rows, %d delivered, %d duplicates from the marks the cut lost", rows, len(delivered), dups)
	out := logs.String()
	if !strings.Contains(out, "cannot reach the outbox table") || !strings.Contains(out, "resumed") {
		t.Errorf("the relay did not log the outage and its end:\n%s", out)
	}
	if strings.Contains(out, password) {
		t.Errorf("the password is in the log:\n%s", out)
	}
}

// Two relays on one table: with row locks and SKIP LOCKED, no message is
// sent twice.
func TestTwoRelaysSendEachRowOnce(t *testing.T) {
	const rows = 1000
	ob, db, _ := setup(t, outbox.WithBatchSize(20))
	q, deliveries := queue(t)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		if _, err := ob.Enqueue(ctx, tx, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	a := &confirmRecorder{pub: newPublisher(t), confirmed: map[string]int{}}
	b := &confirmRecorder{pub: newPublisher(t), confirmed: map[string]int{}}
	start(t, ob.Relay(a))
	start(t, ob.Relay(b))
	delivered := map[string]int{}
	for range rows {
		d := receive(t, deliveries, 30*time.Second)
		delivered[d.MessageId]++
	}
	select { // anything more is a duplicate
	case d := <-deliveries:
		delivered[d.MessageId]++
	case <-time.After(500 * time.Millisecond):
	}
	for id, n := range delivered {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
	if len(delivered) != rows {
		t.Errorf("%d distinct messages, want %d", len(delivered), rows)
	}
	t.Logf("relay A published %d, relay B %d", len(a.confirmed), len(b.confirmed))
}

// A password in the DSN shows nowhere: not in errors, not in the relay's log.
func TestPasswordNeverShown(t *testing.T) {
	const password = "hunter2-very-secret"
	proxy, err := faultproxy.Start(dbtest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	proxy.Refuse(true) // a database that is down
	db := dbtest.OpenLazy(t, dbtest.WithHost(t, proxy.Addr(), password))
	logs := &syncBuffer{}
	ob, err := outbox.New(db, outbox.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var errs []error
	errs = append(errs, ob.Migrate(ctx))
	_, err = ob.List(ctx, outbox.ListOptions{})
	errs = append(errs, err, ob.Retry(ctx, 1))
	_, err = ob.RetryAllFailed(ctx)
	errs = append(errs, err)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ob.Relay(noPublisher{}).Run(runCtx) }()
	eventually(t, 10*time.Second, "the relay logs the outage", func() bool {
		return strings.Count(logs.String(), "cannot reach") >= 2
	})
	cancel()
	errs = append(errs, <-done)

	for i, err := range errs[:4] {
		if err == nil {
			t.Fatalf("call %d succeeded on a database that is down", i)
		}
		if strings.Contains(err.Error(), password) {
			t.Errorf("error shows the password: %v", err)
		}
	}
	if errs[4] != nil {
		t.Errorf("Run: %v, want nil after cancel", errs[4])
	}
	if strings.Contains(logs.String(), password) {
		t.Errorf("log shows the password:\n%s", logs)
	}
	t.Logf("what a user sees: %v", errs[1])
}

type noPublisher struct{}

func (noPublisher) Publish(context.Context, string, string, amqp.Publishing) error {
	return errors.New("never called: the database is down")
}

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

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/internal/dbtest"
	"github.com/amqpretry/amqpretry/publisher"
)

// confirmRecorder passes publishes to the real publisher and remembers which
// message ids the broker confirmed; hook runs after each confirm.
type confirmRecorder struct {
	pub       outbox.Publisher
	mu        sync.Mutex
	confirmed map[string]int
	hook      func(n int)
	inFlight  int // publishes under way
	maxFlight int // the most at once
}

func (c *confirmRecorder) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	c.mu.Lock()
	c.inFlight++
	c.maxFlight = max(c.maxFlight, c.inFlight)
	c.mu.Unlock()
	err := c.pub.Publish(ctx, exchange, key, msg)
	c.ended(msg.MessageId, err)
	return err
}

// PublishAsync is Publish's asynchronous twin: it counts the same way, in
// the outcome's callback.
func (c *confirmRecorder) PublishAsync(ctx context.Context, exchange, key string, msg amqp.Publishing, done func(error)) error {
	c.mu.Lock()
	c.inFlight++
	c.maxFlight = max(c.maxFlight, c.inFlight)
	c.mu.Unlock()
	err := c.pub.(outbox.AsyncPublisher).PublishAsync(ctx, exchange, key, msg, func(err error) {
		c.ended(msg.MessageId, err)
		done(err)
	})
	if err != nil {
		c.mu.Lock()
		c.inFlight--
		c.mu.Unlock()
	}
	return err
}

func (c *confirmRecorder) ended(id string, err error) {
	c.mu.Lock()
	c.inFlight--
	if err != nil {
		c.mu.Unlock()
		return
	}
	c.confirmed[id]++
	n := 0
	for _, k := range c.confirmed {
		n += k
	}
	c.mu.Unlock()
	if c.hook != nil {
		c.hook(n)
	}
}

// checkSentOnlyIfConfirmed checks, after a relay stopped, each of ob's
// first rows against rec: sent only if the broker confirmed it, confirmed
// only if sent (or it is sent again), no try counted for the shutdown. It
// returns how many are sent.
func checkSentOnlyIfConfirmed(t *testing.T, ob *outbox.Outbox, rec *confirmRecorder, rows int) (sent int) {
	t.Helper()
	list, err := ob.List(context.Background(), outbox.ListOptions{Limit: rows})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list {
		switch confirmed := rec.wasConfirmed(r.MessageID); {
		case r.Status == outbox.StatusSent && !confirmed:
			t.Errorf("row %d is sent without a confirm", r.ID)
		case r.Status != outbox.StatusSent && confirmed:
			t.Errorf("row %d was confirmed but is %s: it will be sent again", r.ID, r.Status)
		case r.Status == outbox.StatusInFlight && r.RetriedCount != 0:
			t.Errorf("row %d counts %d tries for a shutdown", r.ID, r.RetriedCount)
		}
		if r.Status == outbox.StatusSent {
			sent++
		}
	}
	return sent
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
	for _, mode := range publishModes {
		t.Run(mode.name, func(t *testing.T) { databaseGoesAwayMidRelay(t, mode.async) })
	}
}

func databaseGoesAwayMidRelay(t *testing.T, async bool) {
	const rows, password = 600, "s3cret-pw-0utb0x"
	ob, db, schema := setup(t)
	q, deliveries := queue(t)

	proxy, err := faultproxy.Start(dbtest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	relayDB := dbtest.Open(t, dbtest.WithHost(t, proxy.Addr(), password))
	logs := &testlog.Buffer{}
	// A claim whose answer the cut loses has leased its rows all the same:
	// they wait out the lease (a minute by default, as long as the test
	// waits for the deliveries), so the lease here is short.
	relayOutbox, err := outbox.New(relayDB, outbox.WithTable(schema+".outbox"), outbox.WithBatchSize(50),
		outbox.WithPublishTimeout(2*time.Second), outbox.WithLease(4*time.Second),
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
	start(t, relayIn(relayOutbox, async, rec))
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
	for _, mode := range publishModes {
		t.Run(mode.name, func(t *testing.T) { twoRelaysSendEachRowOnce(t, mode.async) })
	}
}

func twoRelaysSendEachRowOnce(t *testing.T, async bool) {
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
	start(t, relayIn(ob, async, a))
	start(t, relayIn(ob, async, b))
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
	logs := &testlog.Buffer{}
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

// Shutdown in the middle of a batch: what the broker confirmed before it is
// recorded as sent (else it would be sent again); what it did not is left
// in flight without counting a try.
func TestShutdownRecordsTheConfirmsItHas(t *testing.T) {
	const rows = 400
	ob, db, _ := setup(t, outbox.WithWorkers(1), outbox.WithBatchSize(rows), outbox.WithConcurrency(10))
	q, _ := queue(t)
	for i := range rows {
		enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	rec := &confirmRecorder{pub: newPublisher(t), confirmed: map[string]int{}}
	rec.hook = func(n int) {
		if n == 100 {
			cancel()
		}
	}
	if err := ob.Relay(rec).Run(ctx); err != nil {
		t.Fatal(err)
	}
	sent := checkSentOnlyIfConfirmed(t, ob, rec, rows)
	if sent < 100 || sent == rows {
		t.Fatalf("%d of %d rows sent; the shutdown came after the 100th confirm", sent, rows)
	}
	t.Logf("%d rows confirmed and recorded before the shutdown, %d left in flight", sent, rows-sent)
}

// A publisher closed under the relay stops it with an error that says so;
// the row is untouched.
func TestClosedPublisherStopsTheRelay(t *testing.T) {
	ob, db, _ := setup(t)
	id := enqueue(t, db, ob, "", "anywhere", amqp.Publishing{})
	pub := newPublisher(t)
	_ = pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := ob.Relay(pub).Run(ctx)
	if !errors.Is(err, publisher.ErrClosed) {
		t.Fatalf("Run: %v, want publisher.ErrClosed", err)
	}
	if r := row(t, ob, id); r.Status != outbox.StatusInFlight || r.RetriedCount != 0 {
		t.Fatalf("row is %s with %d tries, want in flight and untouched", r.Status, r.RetriedCount)
	}
}

// Large messages are claimed a few at a time, under WithMaxBatchBytes, and
// all are sent, one pass after the other: a batch cut short by its bytes
// is not a sign that nothing more is due, so the relay does not wait its
// poll interval (a minute here) before the next.
func TestLargeMessagesAreBatchedByBytes(t *testing.T) {
	ob, db, _ := setup(t, outbox.WithWorkers(1), outbox.WithMaxBatchBytes(5<<19), outbox.WithPollInterval(time.Minute)) // 2.5 MiB
	q, deliveries := queue(t)
	for i := range 6 {
		enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: strconv.Itoa(i), Body: make([]byte, 1<<20)})
	}
	rec := &confirmRecorder{pub: newPublisher(t), confirmed: map[string]int{}}
	start(t, ob.Relay(rec))
	for range 6 {
		receive(t, deliveries, 30*time.Second)
	}
	if rec.maxFlight > 2 {
		t.Fatalf("%d messages of 1 MiB were published at once under a 2.5 MiB budget", rec.maxFlight)
	}
}

// A broker outage longer than the whole retry schedule fails no row: a
// publish that finds the publisher without a connection counts no try, and
// the relay waits the outage out. Once the broker is back every row is sent.
func TestBrokerOutageCountsNoTries(t *testing.T) {
	const rows = 20
	ob, db, _ := setup(t, outbox.WithMaxTries(2), outbox.WithRetryBackoff(10*time.Millisecond, 20*time.Millisecond),
		outbox.WithPublishTimeout(200*time.Millisecond))
	q, deliveries := queue(t)
	proxy, url := brokertest.Proxy(t)
	pub, err := publisher.New(url, publisher.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	var logs testlog.Buffer
	relay := ob.Relay(pub, outbox.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	proxy.Refuse(true)
	proxy.CutAll()
	ids := make([]int64, rows)
	for i := range ids {
		ids[i] = enqueue(t, db, ob, "", q, amqp.Publishing{Body: []byte(strconv.Itoa(i))})
	}
	stop := start(t, relay)
	// Long enough for many passes: with tries counted, two would fail a row.
	time.Sleep(2 * time.Second)
	for _, id := range ids {
		if r := row(t, ob, id); r.Status != outbox.StatusInFlight || r.RetriedCount != 0 {
			t.Fatalf("during the outage row %d is %s with %d tries (%q), want in flight with none", id, r.Status, r.RetriedCount, r.LastError)
		}
	}
	if !strings.Contains(logs.String(), "broker is unreachable") {
		t.Errorf("the relay did not log the outage:\n%s", logs.String())
	}

	proxy.Refuse(false)
	for range rows {
		receive(t, deliveries, 30*time.Second)
	}
	eventually(t, 10*time.Second, "every row sent", func() bool {
		for _, id := range ids {
			if statusOf(t, db, ob, id) != outbox.StatusSent {
				return false
			}
		}
		return true
	})
	stop()
}

package outbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
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

// held counts the in-flight rows a claim still holds: nobody may take them
// until its lease ends.
func held(t *testing.T, db *sql.DB, ob *outbox.Outbox) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM ` + ob.Table() + ` WHERE status = 'in_flight' AND claim IS NOT NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Defect 1 of issue 35: a shutdown forgot the rows the broker had already
// confirmed. Their outcomes were written only once every publish of the
// batch had ended, under the context the shutdown timer cancels: nothing
// was marked sent (so all of it was sent again after a restart), the rows
// claimed but not published waited out the lease, and WithShutdownTimeout(0)
// recorded nothing at all. Now each confirm is recorded as it arrives,
// under a context that outlives the shutdown timeout, and every row not
// confirmed is handed back, due at once.
func TestShutdownRecordsConfirmsAndHandsBackTheRest(t *testing.T) {
	for _, mode := range publishModes {
		for _, shutdown := range []time.Duration{500 * time.Millisecond, 0} {
			t.Run(mode.name+"/shutdown timeout "+shutdown.String(), func(t *testing.T) {
				const rows, confirms = 25, 10
				ob, db, _ := setup(t, outbox.WithWorkers(1), outbox.WithConcurrency(confirms), outbox.WithShutdownTimeout(shutdown))
				q, _ := queue(t)
				for i := range rows {
					enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				// 1.5 s each way: a confirm comes 3 s after its publish, so the
				// publishes the first confirms make room for are still
				// unconfirmed when the shutdown timeout ends.
				rec := &confirmRecorder{pub: slowPublisher(t, 1500*time.Millisecond), confirmed: map[string]int{}}
				rec.hook = func(n int) {
					if n == confirms {
						cancel()
					}
				}
				if err := relayIn(ob, mode.async, rec).Run(ctx); err != nil {
					t.Fatal(err)
				}
				sent := checkSentOnlyIfConfirmed(t, ob, rec, rows)
				if n := held(t, db, ob); n > 0 {
					t.Errorf("%d rows not confirmed are still claimed after Run returned: they wait out the lease", n)
				}
				if sent < confirms {
					t.Errorf("%d rows marked sent, want the %d the broker confirmed before the shutdown", sent, confirms)
				}
				t.Logf("%d rows confirmed and marked sent, %d handed back", sent, rows-sent)
			})
		}
	}
}

// Defect 5 of issue 35: a relay stopped while its claim was under way
// stranded the claimed rows for a whole lease (a minute by default): the
// claim ran under the context that Run's caller cancels, so the statement
// committed at the database while the relay gave up on its answer. The
// database connection here is slow, so the claim has committed well before
// the relay reads it; the test stops the relay in that window.
func TestRelayStoppedDuringItsClaimHandsTheRowsBack(t *testing.T) {
	const rows = 20
	ob, db, schema := setup(t)
	q, _ := queue(t)
	for i := range rows {
		enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
	}
	proxy, err := faultproxy.Start(dbtest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	slowDB := dbtest.Open(t, dbtest.WithHost(t, proxy.Addr(), ""))
	if err := slowDB.Ping(); err != nil {
		t.Fatal(err)
	}
	proxy.SetLatency(300 * time.Millisecond)
	slowOutbox, err := outbox.New(slowDB, outbox.WithTable(schema+".outbox"), outbox.WithLogger(testLogger(t)), outbox.WithWorkers(1))
	if err != nil {
		t.Fatal(err)
	}
	var published atomic.Int32
	pub := &hookPublisher{pub: newPublisher(t), before: func() { published.Add(1) }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- slowOutbox.Relay(pub).Run(ctx) }()
	eventually(t, 20*time.Second, "the relay's claim committed", func() bool {
		var n int
		_ = db.QueryRow(`SELECT count(*) FROM ` + ob.Table() + ` WHERE claim IS NOT NULL`).Scan(&n)
		return n > 0
	})
	cancel() // the claim's answer is still on its way through the slow connection
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := held(t, db, ob); n > 0 {
		t.Fatalf("%d of %d rows are held by the stopped relay's claim (%d published): no relay sends them until the lease ends", n, rows, published.Load())
	}
}

// Defect 4 of issue 35: WithLease at its documented minimum (the publish
// timeout plus a second) was accepted, yet no row was ever published: a
// publish started only if the lease left exceeded the publish timeout plus
// a second, which no claim that took any time could meet, so every row was
// claimed again and again and never tried. A publish's timeout is now fitted
// to the lease left.
func TestLeaseAtItsMinimumPublishes(t *testing.T) {
	const rows = 5
	ob, db, _ := setup(t)
	q, deliveries := queue(t)
	for i := range rows {
		enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
	}
	start(t, ob.Relay(newPublisher(t), outbox.WithPublishTimeout(2*time.Second), outbox.WithLease(3*time.Second)))
	for range rows {
		receive(t, deliveries, 20*time.Second)
	}
}

// routePublisher sends the rows for one routing key through a publisher of
// their own: a destination of their own.
type routePublisher struct {
	pub, stuck outbox.Publisher
	stuckKey   string
	stuckEnded atomic.Int32
}

func (p *routePublisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	if key != p.stuckKey {
		return p.pub.Publish(ctx, exchange, key, msg)
	}
	defer p.stuckEnded.Add(1)
	return p.stuck.Publish(ctx, exchange, key, msg)
}

func (p *routePublisher) PublishAsync(ctx context.Context, exchange, key string, msg amqp.Publishing, done func(error)) error {
	if key != p.stuckKey {
		return p.pub.(outbox.AsyncPublisher).PublishAsync(ctx, exchange, key, msg, done)
	}
	err := p.stuck.(outbox.AsyncPublisher).PublishAsync(ctx, exchange, key, msg, func(err error) {
		p.stuckEnded.Add(1)
		done(err)
	})
	if err != nil {
		p.stuckEnded.Add(1)
	}
	return err
}

// Defect 3 of issue 35: one destination that never confirms (a quorum
// queue without its majority; here a connection that hangs) throttled the
// whole relay: a pass recorded its outcomes, and claimed the next batch,
// only after its slowest publish had timed out. Now outcomes are recorded
// as they arrive and the relay keeps claiming while the stragglers wait, so
// every healthy row is sent while the stuck ones still wait for their
// confirms.
func TestStuckDestinationCostsOnlyItsOwnRows(t *testing.T) {
	for _, mode := range publishModes {
		t.Run(mode.name, func(t *testing.T) { stuckDestinationCostsOnlyItsOwnRows(t, mode.async) })
	}
}

func stuckDestinationCostsOnlyItsOwnRows(t *testing.T, async bool) {
	const rows, every = 1000, 100
	ob, db, _ := setup(t)
	q, _ := queue(t)
	stuckQ, _ := queue(t)
	proxy, url := brokertest.Proxy(t)
	stuck, err := publisher.New(url, publisher.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stuck.Close() })
	proxy.Blackhole(true)
	t.Cleanup(func() { proxy.Blackhole(false) }) // before the publisher closes and the relay stops
	pub := &routePublisher{pub: newPublisher(t), stuck: stuck, stuckKey: stuckQ}
	healthy := 0
	for i := range rows {
		key := q
		if i%every == every/2 {
			key = stuckQ
		} else {
			healthy++
		}
		enqueue(t, db, ob, "", key, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
	}
	const publishTimeout = 30 * time.Second
	began := time.Now()
	start(t, relayIn(ob, async, pub, outbox.WithPublishTimeout(publishTimeout), outbox.WithShutdownTimeout(500*time.Millisecond)))
	eventually(t, publishTimeout, "every healthy row sent", func() bool {
		if n := pub.stuckEnded.Load(); n > 0 {
			t.Fatalf("a publish to the stuck destination ended (%d) before the healthy rows were all sent", n)
		}
		var sent int
		_ = db.QueryRow(`SELECT count(*) FROM `+ob.Table()+` WHERE status = 'sent' AND routing_key = $1`, q).Scan(&sent)
		return sent == healthy
	})
	t.Logf("%d healthy rows sent in %v, while %d rows wait for confirms that do not come", healthy, time.Since(began).Round(time.Millisecond), rows-healthy)
}

// Defect 6 of issue 35: a broker connection that stalls while large
// messages are being written kept Run going long past its shutdown timeout
// (14.6 s for a 1 s timeout): a publish blocked in a socket write inside
// amqp091-go does not see its context end. The publisher now abandons a
// connection whose stuck send outlived its caller's context, so the relay's
// publishes end with the grace period, and the rows are handed back.
func TestFrozenBrokerDoesNotHoldRunPastItsShutdownTimeout(t *testing.T) {
	for _, mode := range publishModes {
		t.Run(mode.name, func(t *testing.T) { frozenBrokerDoesNotHoldRun(t, mode.async) })
	}
}

func frozenBrokerDoesNotHoldRun(t *testing.T, async bool) {
	const rows = 40
	const shutdown = time.Second
	ob, db, _ := setup(t, outbox.WithShutdownTimeout(shutdown))
	q, _ := queue(t)
	for i := range rows {
		enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i), Body: make([]byte, 1<<20)})
	}
	proxy, url := brokertest.Proxy(t)
	pub, err := publisher.New(url, publisher.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	t.Cleanup(func() { proxy.Blackhole(false) }) // before the publisher closes
	var started atomic.Int32
	frozen := make(chan struct{})
	hooked := &hookPublisher{pub: pub, before: func() {
		if started.Add(1) == 3 {
			proxy.Blackhole(true)
			close(frozen)
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- relayIn(ob, async, hooked).Run(ctx) }()
	<-frozen
	time.Sleep(500 * time.Millisecond) // the writes back up in the socket buffers
	cancel()
	stopped := time.Now()
	// The bound is generous: the shutdown timeout, then the publisher's
	// watchdog tick (a second) and the recording; without the fix Run
	// waited for the publisher's stall detector (two heartbeats).
	const bound = shutdown + 5*time.Second
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Run returned %v after the cancel (shutdown timeout %v)", time.Since(stopped).Round(time.Millisecond), shutdown)
	case <-time.After(bound):
		proxy.Blackhole(false)
		<-done
		t.Fatalf("Run returned %v after the cancel, want within its shutdown timeout %v (and the publisher's watchdog tick)", time.Since(stopped).Round(time.Millisecond), shutdown)
	}
	if n := held(t, db, ob); n > 0 {
		t.Logf("%d rows whose publishes were cut stay claimed until the lease ends", n)
	}
}

// Issue 35's cost: the relay published each row from a goroutine that
// waited for the row's confirm, up to WithConcurrency (a batch, 500, by
// default) per worker. Through a *publisher.Publisher it now publishes with
// PublishAsync: confirms come to callbacks, and no goroutine waits on one.
// With every confirm held back, the bare publisher's relay holds a few
// goroutines for 400 rows awaiting their confirms; the same relay made to
// use Publish holds one per row (which the test checks too, to show that it
// can see them). When the confirms come, every row is sent once.
func TestRelayAwaitsConfirmsWithoutAGoroutineEach(t *testing.T) {
	const rows = 400
	for _, mode := range publishModes {
		t.Run(mode.name, func(t *testing.T) {
			ob, db, _ := setup(t, outbox.WithWorkers(1))
			q, deliveries := queue(t)
			for i := range rows {
				enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
			}
			proxy, url := brokertest.Proxy(t)
			// A heartbeat long enough that holding the confirms back does
			// not end the connection.
			pub, err := publisher.New(url, publisher.WithLogger(slog.New(slog.DiscardHandler)), publisher.WithHeartbeat(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			t.Cleanup(func() { proxy.Blackhole(false) }) // before the publisher closes
			relay := ob.Relay(pub)                       // a bare publisher: PublishAsync
			if !mode.async {
				relay.PublishAsyncThrough(nil)
			}
			before := runtime.NumGoroutine()
			proxy.Blackhole(true)
			start(t, relay)
			eventually(t, 20*time.Second, "every row claimed", func() bool { return held(t, db, ob) == rows })
			peak := 0
			for range 50 { // the publishes start as the claim returns
				peak = max(peak, runtime.NumGoroutine())
				time.Sleep(20 * time.Millisecond)
			}
			proxy.Blackhole(false)
			counts := countDeliveries(t, deliveries)
			eventually(t, 30*time.Second, "every row sent", func() bool { return sentRows(t, db, ob) == rows })
			eventually(t, 10*time.Second, "every message delivered", func() bool { return len(counts()) == rows })
			t.Logf("%d rows awaiting their confirms: %d goroutines, %d before the relay started", rows, peak, before)
			extra := peak - before
			switch {
			case mode.async && extra > 100:
				t.Errorf("%d goroutines more than before the relay started, with %d rows awaiting their confirms: one waits on each", extra, rows)
			case !mode.async && extra < rows:
				t.Errorf("through Publish, %d goroutines more than before the relay started, with %d rows awaiting their confirms: want one on each, or the test does not see them", extra, rows)
			}
		})
	}
}

// sentRows counts ob's rows marked sent.
func sentRows(t *testing.T, db *sql.DB, ob *outbox.Outbox) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM ` + ob.Table() + ` WHERE status = 'sent'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A row whose PublishAsync gave up before sending it (waiting for the
// publisher's room, WithMaxInFlight, until the row's deadline) was never
// sent: it goes back due at once with no try counted, as a row the broker
// could not be reached for does, rather than a try that brings it nearer
// to failing for good; and one that waited for room started with little of
// its timeout left. The relay keeps its publishes within the publisher's
// room, so rows wait for the worker's own slots instead, before their
// timeout starts. Here the publisher has room for 3 and the broker
// confirms nothing: 3 rows are sent and time out (a try each), and the
// next 3 are still waiting for their confirms, with a full timeout, when
// the relay stops.
func TestARowThatWaitedForRoomIsNotATry(t *testing.T) {
	const rows, room = 10, 3
	ob, db, _ := setup(t, outbox.WithWorkers(1), outbox.WithConcurrency(rows), outbox.WithPublishTimeout(2*time.Second),
		outbox.WithShutdownTimeout(0)) // the publishes under way at the end are cut, not timed out
	q, _ := queue(t)
	for i := range rows {
		enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "m" + strconv.Itoa(i)})
	}
	proxy, url := brokertest.Proxy(t)
	pub, err := publisher.New(url, publisher.WithLogger(slog.New(slog.DiscardHandler)),
		publisher.WithHeartbeat(10*time.Second), publisher.WithMaxInFlight(room))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	t.Cleanup(func() { proxy.Blackhole(false) }) // before the publisher closes
	proxy.Blackhole(true)
	stop := start(t, ob.Relay(pub))
	eventually(t, 20*time.Second, "the first publishes timed out", func() bool {
		var tried int
		_ = db.QueryRow(`SELECT count(*) FROM ` + ob.Table() + ` WHERE retried_count > 0`).Scan(&tried)
		return tried >= room
	})
	time.Sleep(500 * time.Millisecond) // the rows that waited for room are recorded too
	stop()
	list, err := ob.List(context.Background(), outbox.ListOptions{Limit: rows})
	if err != nil {
		t.Fatal(err)
	}
	tried := 0
	for _, r := range list {
		if r.RetriedCount > 0 {
			tried++
			if strings.Contains(r.LastError, "WithMaxInFlight") {
				t.Errorf("row %d counts a try for a publish that waited for room and was never sent: %s", r.ID, r.LastError)
			}
		}
	}
	t.Logf("%d of %d rows count a try (sent, then not confirmed in time)", tried, rows)
	if tried > room {
		t.Errorf("%d rows count a try, want at most the %d the publisher had room for: the others started with little of their timeout left, after waiting for room", tried, room)
	}
}

// A typed nil *publisher.Publisher (publisher.New's error ignored) is
// refused like a nil Publisher, rather than panicking in a worker.
func TestRelayRefusesANilPublisher(t *testing.T) {
	ob, _, _ := setup(t)
	var pub *publisher.Publisher
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ob.Relay(pub).Run(ctx); err == nil || !strings.Contains(err.Error(), "nil *publisher.Publisher") {
		t.Errorf("Relay(a nil *publisher.Publisher).Run: %v, want the nil publisher refused", err)
	}
}

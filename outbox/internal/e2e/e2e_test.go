//go:build disruptive

package e2e

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/inbox"
	"github.com/amqpretry/amqpretry/outbox/internal/dbtest"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// relayChildEnv carries "table url" to the child process that runs the
// relay: the outbox table and the AMQP URL of the proxy in front of the
// broker.
const relayChildEnv = "AMQPRETRY_E2E_RELAY"

// rollbackEvery: every tenth order's transaction is rolled back on purpose,
// after its message was enqueued in it.
const rollbackEvery = 10

// routingKey binds the test's queue to its exchange.
const routingKey = "order.created"

// TestOutboxEndToEnd: 20,000 orders (AMQPRETRY_E2E_ORDERS), each written
// with its message in one transaction, a tenth of them rolled back. Two
// relays, each in a child process, publish through a proxy that cuts their
// connections every 2 s; one is SIGKILLed once and started again; the
// broker's app stops and starts once. A listener behind a proxy of its own, cut as often,
// records each order's effect through the inbox. At the end every committed
// order has its effect exactly once, and no rolled-back order has a message
// or an effect.
func TestOutboxEndToEnd(t *testing.T) {
	if cfg := os.Getenv(relayChildEnv); cfg != "" {
		runRelayChild(t, cfg)
		return
	}
	n := envInt("AMQPRETRY_E2E_ORDERS", 20000)
	brokertest.Dial(t)
	db := dbtest.DB(t)
	db.SetMaxOpenConns(16)
	schema := dbtest.Schema(t, db)
	ctx := context.Background()
	for _, stmt := range []string{
		`CREATE TABLE ` + schema + `.orders (id bigint PRIMARY KEY, amount integer NOT NULL)`,
		// No unique key on order_id: a duplicated effect must be counted,
		// not refused.
		`CREATE TABLE ` + schema + `.shipments (seq bigint GENERATED ALWAYS AS IDENTITY, order_id bigint NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	quiet := slog.New(slog.DiscardHandler)
	ob, err := outbox.New(db, outbox.WithTable(schema+".outbox"), outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, inbox.WithTable(schema+".inbox"), inbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []func(context.Context) error{ob.Migrate, ib.Migrate} {
		if err := m(ctx); err != nil {
			t.Fatal(err)
		}
	}
	exchange, queue := brokertest.Name(t, "orders"), brokertest.Name(t, "shipping")
	brokertest.Exchange(t, exchange, "direct")
	brokertest.Queue(t, queue, nil)
	brokertest.Bind(t, queue, exchange, routingKey)

	relayProxy, relayURL := brokertest.Proxy(t)
	consumerProxy, consumerURL := brokertest.Proxy(t)

	// The consumer: each delivery is counted, then goes through Retry into
	// the inbox, which records the message id and the shipment in one
	// transaction. Exhausted retries requeue (no Recover): nothing leaves
	// the queue without its effect committed.
	var mu sync.Mutex
	delivered := map[int64]int{}
	redelivered := 0
	count := func(next middleware.Handler) middleware.Handler {
		return func(ctx context.Context, d *amqp.Delivery) error {
			id, _ := strconv.ParseInt(string(d.Body), 10, 64)
			mu.Lock()
			delivered[id]++
			if d.Redelivered {
				redelivered++
			}
			mu.Unlock()
			return next(ctx, d)
		}
	}
	ship := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		id, err := strconv.ParseInt(string(d.Body), 10, 64)
		if err != nil {
			return middleware.Permanent(fmt.Errorf("body %q is not an order id: %w", d.Body, err))
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO `+schema+`.shipments (order_id) VALUES ($1)`, id)
		return err
	})
	consumer, err := listener.New(queue,
		middleware.Chain(count, middleware.Retry(5, middleware.WithInitialInterval(20*time.Millisecond), middleware.WithMaxInterval(500*time.Millisecond)),
			// a database down longer than the retries: back to the queue; a body that is no order id: the queue's DLX
			middleware.Recover(recoverer.ByError(recoverer.Requeue(),
				recoverer.When(middleware.ErrorFunc("permanent", middleware.IsPermanent), recoverer.Reject())))),
		ship, listener.WithURL(consumerURL), listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(4),
		listener.WithPrefetch(50), listener.WithHeartbeat(2*time.Second), listener.WithRequeueDelay(50*time.Millisecond, time.Second),
		listener.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}

	begin := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			wg.Wait()
		}
	}
	defer stop()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := consumer.Run(runCtx); err != nil {
			t.Error(err)
		}
	}()

	// Two relay processes race for the rows (FOR UPDATE SKIP LOCKED); the
	// first is the one killed.
	relays := []*relayProcess{startRelay(t, schema+".outbox", relayURL), startRelay(t, schema+".outbox", relayURL)}

	// The writers: orders 0..n-1, each in a transaction with its message;
	// every tenth rolled back after the Enqueue.
	var next, committed, rolledBack, failedTx atomic.Int64
	rolledBackIDs := make([]bool, n)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				id := next.Add(1) - 1
				if id >= int64(n) {
					return
				}
				rollback := id%rollbackEvery == rollbackEvery-1
				if err := placeOrder(runCtx, db, ob, schema, exchange, id, rollback); err != nil {
					failedTx.Add(1)
					if runCtx.Err() == nil {
						t.Errorf("order %d: %v", id, err)
					}
					continue
				}
				if rollback {
					rolledBackIDs[id] = true // each id is written by one goroutine, read after wg.Wait
					rolledBack.Add(1)
				} else {
					committed.Add(1)
				}
			}
		}()
	}

	// The faults: every 2 s both proxies cut their connections; at a
	// quarter of the orders the first relay is SIGKILLed and started again; at
	// half of them the broker's app stops for a few seconds.
	cuts, kills, restarts := 0, 0, 0
	relayAccepted, consumerAccepted := relayProxy.Accepted(), consumerProxy.Accepted()
	deadline := begin.Add(time.Duration(n)*5*time.Millisecond + 2*time.Minute)
	lastCut := time.Now()
	for {
		if t.Failed() {
			t.FailNow()
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done after %v: %d committed, %s; relays' output:\n%s\n%s", time.Since(begin).Round(time.Second), committed.Load(), progress(t, db, schema), relays[0].output(), relays[1].output())
		}
		time.Sleep(200 * time.Millisecond)
		if time.Since(lastCut) >= 2*time.Second {
			relayProxy.CutAll()
			consumerProxy.CutAll()
			cuts++
			lastCut = time.Now()
		}
		done := committed.Load() + rolledBack.Load() + failedTx.Load()
		switch {
		case kills == 0 && done >= int64(n/4):
			relays[0].kill(t)
			kills++
			relays[0] = startRelay(t, schema+".outbox", relayURL)
		case restarts == 0 && kills == 1 && done >= int64(n/2):
			restartBrokerApp(t)
			restarts++
		}
		if done == int64(n) && kills == 1 && restarts == 1 && settled(t, db, schema) {
			break
		}
	}
	took := time.Since(begin)
	// Let stragglers (a redelivery whose ack was cut) arrive before judging;
	// then stop everything, so the counts no longer change.
	time.Sleep(2 * time.Second)
	for _, r := range relays {
		r.stop(t)
	}
	stop()

	if relayProxy.Accepted() <= relayAccepted+1 || consumerProxy.Accepted() <= consumerAccepted+1 {
		t.Errorf("the proxies accepted %d and %d new connections: the cuts were not felt",
			relayProxy.Accepted()-relayAccepted, consumerProxy.Accepted()-consumerAccepted)
	}
	if d := brokertest.Depth(t, queue); d != 0 {
		t.Errorf("%s still holds %d messages", queue, d)
	}

	// The database is the truth about what committed.
	var orderRows, outboxRows, sent, maxTries, sumTries int64
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+schema+`.orders`).Scan(&orderRows); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'sent'), COALESCE(max(retried_count), 0), COALESCE(sum(retried_count), 0) FROM `+schema+`.outbox`).
		Scan(&outboxRows, &sent, &maxTries, &sumTries); err != nil {
		t.Fatal(err)
	}
	if orderRows != committed.Load() {
		t.Errorf("%d orders in the table, %d commits succeeded", orderRows, committed.Load())
	}
	if outboxRows != orderRows || sent != orderRows {
		t.Errorf("outbox: %d rows, %d sent; want one sent row per committed order (%d)", outboxRows, sent, orderRows)
	}
	effects := map[int64]int{}
	rows, err := db.QueryContext(ctx, `SELECT order_id, count(*) FROM `+schema+`.shipments GROUP BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	totalEffects := 0
	for rows.Next() {
		var id int64
		var c int
		if err := rows.Scan(&id, &c); err != nil {
			t.Fatal(err)
		}
		effects[id] = c
		totalEffects += c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	_ = rows.Close()
	var inOrders []int64
	if err := func() error {
		rs, err := db.QueryContext(ctx, `SELECT id FROM `+schema+`.orders`)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			var id int64
			if err := rs.Scan(&id); err != nil {
				return err
			}
			inOrders = append(inOrders, id)
		}
		return rs.Err()
	}(); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	missing, duplicated, ofRolledBack, deliveredOfRolledBack := 0, 0, 0, 0
	for _, id := range inOrders {
		switch c := effects[id]; {
		case c == 0:
			missing++
			if missing <= 10 {
				t.Errorf("order %d committed, but has no shipment (delivered %d times)", id, delivered[id])
			}
		case c > 1:
			duplicated++
			if duplicated <= 10 {
				t.Errorf("order %d shipped %d times", id, c)
			}
		}
	}
	for id, rb := range rolledBackIDs {
		if !rb {
			continue
		}
		if effects[int64(id)] > 0 {
			ofRolledBack++
			t.Errorf("order %d was rolled back, yet shipped %d times", id, effects[int64(id)])
		}
		if delivered[int64(id)] > 0 {
			deliveredOfRolledBack++
			t.Errorf("order %d was rolled back, yet its message was delivered %d times", id, delivered[int64(id)])
		}
	}
	totalDelivered := 0
	for _, c := range delivered {
		totalDelivered += c
	}
	if missing > 0 || duplicated > 0 {
		t.Errorf("%d orders without their shipment, %d shipped more than once", missing, duplicated)
	}
	if kills != 1 || restarts != 1 {
		t.Errorf("the relay was killed %d times and the broker restarted %d times, want once each", kills, restarts)
	}
	t.Logf("outbox end to end on %s: %d orders in %v: %d committed, %d rolled back on purpose, %d transactions failed",
		brokerVersion(t), n, took.Round(100*time.Millisecond), orderRows, rolledBack.Load(), failedTx.Load())
	t.Logf("broker delivered %d messages for %d orders (%d duplicates, %d flagged redelivered); %d shipments for %d orders: %d missing, %d duplicated; rolled-back orders: %d delivered, %d shipped",
		totalDelivered, len(delivered), totalDelivered-len(delivered), redelivered, totalEffects, len(effects), missing, duplicated, deliveredOfRolledBack, ofRolledBack)
	t.Logf("faults: %d rounds of connection cuts (the relays' and the consumer's), one of the two relay processes SIGKILLed %d time(s) and restarted, broker app restarted %d time(s); outbox: %d rows sent, %d failed publishes retried (max %d for one row)",
		cuts, kills, restarts, sent, sumTries, maxTries)
}

// placeOrder writes order id and its message in one transaction, and
// commits it, or rolls it back when rollback is set.
func placeOrder(ctx context.Context, db *sql.DB, ob *outbox.Outbox, schema, exchange string, id int64, rollback bool) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+schema+`.orders (id, amount) VALUES ($1, $2)`, id, 100+id%900); err != nil {
		return err
	}
	body := strconv.FormatInt(id, 10)
	if _, err := ob.Enqueue(ctx, tx, exchange, routingKey, amqp.Publishing{
		ContentType: "text/plain", DeliveryMode: amqp.Persistent, Body: []byte(body),
	}); err != nil {
		return err
	}
	if rollback {
		return tx.Rollback()
	}
	return tx.Commit()
}

// settled reports whether the work is done: no outbox row waits to be
// sent, and every order has at least one shipment.
func settled(t *testing.T, db *sql.DB, schema string) bool {
	t.Helper()
	var pending, unshipped int
	err := db.QueryRow(`SELECT
	  (SELECT count(*) FROM `+schema+`.outbox WHERE status <> 'sent'),
	  (SELECT count(*) FROM `+schema+`.orders o WHERE NOT EXISTS (SELECT 1 FROM `+schema+`.shipments s WHERE s.order_id = o.id))`).
		Scan(&pending, &unshipped)
	if err != nil {
		t.Fatal(err)
	}
	return pending == 0 && unshipped == 0
}

// progress says where a run that did not finish stands.
func progress(t *testing.T, db *sql.DB, schema string) string {
	t.Helper()
	var inFlight, failed, sent, shipped int
	err := db.QueryRow(`SELECT
	  count(*) FILTER (WHERE status = 'in_flight'), count(*) FILTER (WHERE status = 'failed'), count(*) FILTER (WHERE status = 'sent'),
	  (SELECT count(DISTINCT order_id) FROM `+schema+`.shipments)
	  FROM `+schema+`.outbox`).Scan(&inFlight, &failed, &sent, &shipped)
	if err != nil {
		return "the database does not answer: " + err.Error()
	}
	return fmt.Sprintf("outbox %d in flight, %d failed, %d sent; %d orders shipped", inFlight, failed, sent, shipped)
}

// relayProcess is a child process running the relay.
type relayProcess struct {
	cmd    *exec.Cmd
	exited chan error // receives Wait's result once the output is read
	mu     sync.Mutex
	lines  []string
	ended  bool
	err    error
}

// startRelay starts a relay process on table, publishing through url, and
// waits until it runs. It is killed when the test ends, if still running.
func startRelay(t *testing.T, table, url string) *relayProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOutboxEndToEnd$")
	cmd.Env = append(os.Environ(), relayChildEnv+"="+table+" "+url)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &relayProcess{cmd: cmd, exited: make(chan error, 1)}
	running := make(chan struct{})
	// The reader owns the process: it reads until the pipe closes, then
	// waits for the exit (Wait closes the pipe, so never before).
	go func() {
		s := bufio.NewScanner(out)
		signalled := false
		for s.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, s.Text())
			p.mu.Unlock()
			if !signalled && strings.Contains(s.Text(), "relay running") {
				signalled = true
				close(running)
			}
		}
		_, _ = io.Copy(io.Discard, out)
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() { p.kill(t) })
	select {
	case <-running:
	case err := <-p.exited:
		p.finish(err)
		t.Fatalf("the relay process exited before it ran (%v):\n%s", err, p.output())
	case <-time.After(60 * time.Second):
		p.kill(t)
		t.Fatalf("the relay process did not start within 60s:\n%s", p.output())
	}
	return p
}

func (p *relayProcess) finish(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ended, p.err = true, err
}

func (p *relayProcess) done() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended
}

func (p *relayProcess) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// kill SIGKILLs the process, whatever it is doing, and waits for it.
func (p *relayProcess) kill(t *testing.T) {
	if p.done() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	p.finish(<-p.exited)
}

// stop asks the process to shut down (SIGTERM) and checks that it did,
// gracefully, within 30 s.
func (p *relayProcess) stop(t *testing.T) {
	t.Helper()
	if p.done() {
		t.Errorf("the relay process had already exited:\n%s", p.output())
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.finish(err)
		if err != nil {
			t.Errorf("the relay process ended with %v after SIGTERM:\n%s", err, p.output())
		}
	case <-time.After(30 * time.Second):
		p.kill(t)
		t.Errorf("the relay process did not stop within 30s of SIGTERM:\n%s", p.output())
	}
}

// runRelayChild is the child process: a relay on the table until SIGTERM
// (or SIGKILL, which it never sees).
func runRelayChild(t *testing.T, cfg string) {
	table, url, _ := strings.Cut(cfg, " ")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelError}))
	db, err := sql.Open("pgx", dbtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The broker may be restarting as the process starts: try for a while.
	var pub *publisher.Publisher
	for deadline := time.Now().Add(30 * time.Second); ; {
		pub, err = publisher.New(url, publisher.WithLogger(log), publisher.WithHeartbeat(2*time.Second))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	defer pub.Close()
	ob, err := outbox.New(db, outbox.WithTable(table), outbox.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	relay := ob.Relay(pub, outbox.WithPollInterval(20*time.Millisecond), outbox.WithRetryBackoff(50*time.Millisecond, time.Second),
		outbox.WithMaxTries(1000), outbox.WithPublishTimeout(10*time.Second))
	fmt.Println("relay running")
	if err := relay.Run(ctx); err != nil {
		t.Fatal(err)
	}
	fmt.Println("relay stopped")
}

// restartBrokerApp stops the broker's app for a few seconds, as a broker
// restart would, and always starts it again, also when the test fails.
func restartBrokerApp(t *testing.T) {
	t.Helper()
	started := false
	start := func() {
		if !started {
			started = true
			if _, err := brokertest.Ctl("start_app"); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(start)
	if _, err := brokertest.Ctl("stop_app"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	start()
}

func brokerVersion(t *testing.T) string {
	v, _ := brokertest.Dial(t).Properties["version"].(string)
	return "RabbitMQ " + v
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// Command outbox is reliable publishing end to end: the transactional outbox
// on the producer's side and the idempotent consumer (the inbox) on the
// consumer's. A shop writes
// each order and its "order created" message in one transaction (the
// outbox); a tenth of the payments are declined and their transactions
// rolled back, message and all. A relay, running as a separate process,
// publishes the messages with confirms. Halfway through, the relay is
// SIGKILLed; the orders placed meanwhile wait in the outbox until a new
// relay process starts. A shipping service consumes the messages through
// the inbox: it records the message id and the shipment in one transaction,
// so a message delivered twice (the killed relay may have published some
// rows without marking them sent) ships once. It prints what was committed,
// delivered and shipped, drops its tables and queues, and exits by itself.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable go run ./outbox
package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the PostgreSQL driver
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/examples/internal/exampleutil"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/inbox"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The example's own names, with a suffix of the run's own
// (exampleutil.Name): a schema holding its tables, an exchange, and a work
// queue with its dead-letter exchange and queue. It drops and deletes them
// when it ends, and nothing else.
var (
	schema   = strings.ReplaceAll(exampleutil.Name("amqpretry_example_outbox"), ".", "_")
	exchange = exampleutil.Name("amqpretry.example.outbox.orders")
	topology = dlx.Topology{Queue: exampleutil.Name("amqpretry.example.outbox.shipping")}
)

const routingKey = "order.created"

// relayEnv, set in the environment of a process of this program to the
// shop's schema, makes it the relay of that schema's outbox instead of a shop.
const relayEnv = "AMQPRETRY_EXAMPLE_OUTBOX_RELAY"

// declinedEvery: every tenth payment is declined, its transaction rolled back.
const declinedEvery = 10

func main() {
	orders := flag.Int("orders", 400, "orders to place; the relay is killed after half of them")
	flag.Parse()
	if os.Getenv(relayEnv) != "" {
		os.Exit(relayMain())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, exampleutil.URL(), dsn(), *orders); err != nil {
		log.Fatal(outbox.Redact(err.Error()))
	}
}

// dsn is $DATABASE_URL, or the local PostgreSQL scripts/postgres.sh starts.
func dsn() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

func run(ctx context.Context, out io.Writer, url, dsn string, orders int) error {
	say := exampleutil.NewTimeline(out).Say
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("connect to PostgreSQL at %s (is it up? run scripts/postgres.sh): %w", outbox.Redact(dsn), err)
	}
	ob, err := outbox.New(db, outbox.WithTable(schema+".outbox"))
	if err != nil {
		return err
	}
	ib, err := inbox.New(db, inbox.WithTable(schema+".inbox"), inbox.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return err
	}
	if err := setUp(ctx, db, ob, ib, url); err != nil {
		return err
	}
	defer func() {
		if err := tearDown(db, url); err != nil {
			say("cleaning up: %v", err)
		}
	}()

	// The shipping service: Retry, then the DLQ, around the inbox handler,
	// which runs ship in the transaction that records the message id.
	pub, err := publisher.New(url, publisher.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return err
	}
	defer pub.Close()
	var mu sync.Mutex
	delivered := 0
	ship := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		id, err := strconv.ParseInt(string(d.Body), 10, 64)
		if err != nil {
			return middleware.Permanent(fmt.Errorf("body %q is not an order id", d.Body))
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO `+schema+`.shipments (order_id) VALUES ($1)`, id)
		return err
	}
	counted := func(next middleware.Handler) middleware.Handler {
		return func(ctx context.Context, d *amqp.Delivery) error {
			mu.Lock()
			delivered++
			mu.Unlock()
			return next(ctx, d)
		}
	}
	shipping, err := listener.New(topology.Queue,
		middleware.Chain(counted, middleware.Retry(3), middleware.Recover(recoverer.Republish(pub, topology.DLX(), topology.DLQRoutingKey()))),
		ib.Handler(ship),
		listener.WithURL(url), listener.WithConcurrentConsumers(2), exampleutil.Quiet)
	if err != nil {
		return err
	}
	listeners := exampleutil.Start(ctx, shipping)
	defer listeners.Stop()

	relay, err := startRelay(ctx, say, url, dsn)
	if err != nil {
		return err
	}
	defer relay.kill()

	// The shop: the first half of the orders with the relay running.
	placed := orderCounts{}
	if err := placeOrders(ctx, db, ob, 0, orders/2, &placed); err != nil {
		return err
	}
	say("placed orders 1-%d: %d committed with their message, %d declined and rolled back", orders/2, placed.committed, placed.declined)

	relay.kill()
	s := outboxCounts(ctx, db)
	say("relay process SIGKILLed: the outbox has %d messages sent, %d still in flight", s.sent, s.inFlight)

	if err := placeOrders(ctx, db, ob, orders/2, orders, &placed); err != nil {
		return err
	}
	s = outboxCounts(ctx, db)
	say("placed orders %d-%d with no relay running: %d messages wait in the outbox", orders/2+1, orders, s.inFlight)

	if relay, err = startRelay(ctx, say, url, dsn); err != nil {
		return err
	}
	defer relay.kill()

	// Wait until every committed order has shipped.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var shipped int
		if err := db.QueryRowContext(ctx, `SELECT count(DISTINCT order_id) FROM `+schema+`.shipments`).Scan(&shipped); err != nil {
			return err
		}
		if shipped == placed.committed {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after 60s %d of %d orders shipped", shipped, placed.committed)
		}
		select {
		case err := <-listeners.Errs():
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	// A moment for any duplicate still on its way, then stop both.
	if err := sleep(ctx, time.Second); err != nil {
		return err
	}
	if err := relay.stop(); err != nil {
		return err
	}
	listeners.Stop()

	var shipments, shippedOrders, declinedShipped, committedOrders int
	err = db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT order_id),
	  count(*) FILTER (WHERE order_id NOT IN (SELECT id FROM `+schema+`.orders)),
	  (SELECT count(*) FROM `+schema+`.orders)
	  FROM `+schema+`.shipments`).Scan(&shipments, &shippedOrders, &declinedShipped, &committedOrders)
	if err != nil {
		return err
	}
	mu.Lock()
	deliveries := delivered
	mu.Unlock()
	say("orders committed: %d (and %d declined, rolled back: no message for them)", committedOrders, placed.declined)
	say("messages delivered to the shipping service: %d (%d duplicates, skipped by the inbox)", deliveries, deliveries-shippedOrders)
	say("shipments: %d for %d orders; declined orders shipped: %d", shipments, shippedOrders, declinedShipped)
	if shipments == committedOrders && shippedOrders == committedOrders && declinedShipped == 0 {
		say("every committed order shipped exactly once")
	} else {
		return errors.New("some order did not ship exactly once: see above")
	}
	return nil
}

type orderCounts struct{ committed, declined int }

// placeOrders places orders from..to-1, each with its message in one
// transaction; a declined payment rolls both back.
func placeOrders(ctx context.Context, db *sql.DB, ob *outbox.Outbox, from, to int, c *orderCounts) error {
	for id := from; id < to; id++ {
		declined := id%declinedEvery == declinedEvery-1
		if err := placeOrder(ctx, db, ob, int64(id+1), declined); err != nil {
			return fmt.Errorf("order %d: %w", id+1, err)
		}
		if declined {
			c.declined++
		} else {
			c.committed++
		}
	}
	return nil
}

func placeOrder(ctx context.Context, db *sql.DB, ob *outbox.Outbox, id int64, declined bool) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit, a no-op
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+schema+`.orders (id, amount_cents) VALUES ($1, $2)`, id, 1000+id*7%9000); err != nil {
		return err
	}
	_, err = ob.Enqueue(ctx, tx, exchange, routingKey, amqp.Publishing{
		ContentType:  "text/plain",
		DeliveryMode: amqp.Persistent,
		Body:         []byte(strconv.FormatInt(id, 10)),
	})
	if err != nil {
		return err
	}
	if declined {
		return tx.Rollback()
	}
	return tx.Commit()
}

type counts struct{ sent, inFlight int }

func outboxCounts(ctx context.Context, db *sql.DB) counts {
	var c counts
	_ = db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE status = 'sent'), count(*) FILTER (WHERE status = 'in_flight') FROM `+schema+`.outbox`).
		Scan(&c.sent, &c.inFlight)
	return c
}

// setUp creates the example's tables and topology, under this run's names.
func setUp(ctx context.Context, db *sql.DB, ob *outbox.Outbox, ib *inbox.Inbox, url string) error {
	for _, stmt := range []string{
		`CREATE SCHEMA ` + schema,
		`CREATE TABLE ` + schema + `.orders (id bigint PRIMARY KEY, amount_cents integer NOT NULL)`,
		`CREATE TABLE ` + schema + `.shipments (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, order_id bigint NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	if err := ob.Migrate(ctx); err != nil {
		return err
	}
	if err := ib.Migrate(ctx); err != nil {
		return err
	}
	conn, ch, err := exampleutil.Connect(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := topology.Declare(ch); err != nil {
		return err
	}
	if err := ch.ExchangeDeclare(exchange, "direct", true, false, false, false, nil); err != nil {
		return err
	}
	return ch.QueueBind(topology.Queue, routingKey, exchange, false, nil)
}

// tearDown drops what setUp made.
func tearDown(db *sql.DB, url string) error {
	_, dbErr := db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`)
	conn, ch, err := exampleutil.Connect(url)
	if err != nil {
		return errors.Join(dbErr, err)
	}
	defer conn.Close()
	return errors.Join(dbErr, exampleutil.DeleteQueues(ch, topology.Queue, topology.DLQ()), ch.ExchangeDelete(exchange, false, false),
		ch.ExchangeDelete(topology.DLX(), false, false))
}

// relayProcess is this program started again as the relay.
type relayProcess struct {
	cmd    *exec.Cmd
	exited chan error
	once   sync.Once
	err    error
}

// startRelay starts the relay process and waits until it runs.
func startRelay(ctx context.Context, say func(string, ...any), url, dsn string) (*relayProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), relayEnv+"="+schema, "AMQP_URL="+url, "DATABASE_URL="+dsn)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &relayProcess{cmd: cmd, exited: make(chan error, 1)}
	running := make(chan struct{})
	// This goroutine owns the process: it relays its lines until the pipe
	// closes, then waits for the exit (Wait closes the pipe: never before).
	go func() {
		s := bufio.NewScanner(pipe)
		for first := true; s.Scan(); first = false {
			if first {
				close(running)
			}
			say("relay process %d: %s", cmd.Process.Pid, s.Text())
		}
		_, _ = io.Copy(io.Discard, pipe)
		p.exited <- cmd.Wait()
	}()
	select {
	case <-running:
		return p, nil
	case err := <-p.exited:
		p.once.Do(func() { p.err = err })
		return nil, fmt.Errorf("the relay process exited at once: %v", err)
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		p.kill()
		return nil, errors.New("the relay process did not start within 30s")
	}
}

// kill SIGKILLs the relay and waits for it to be gone; a relay already
// gone is left alone.
func (p *relayProcess) kill() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		p.err = <-p.exited
	})
}

// stop asks the relay to finish (SIGTERM) and waits up to 30 s.
func (p *relayProcess) stop() error {
	var err error
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case p.err = <-p.exited:
			err = p.err
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			p.err = <-p.exited
			err = errors.New("the relay process did not stop within 30s of SIGTERM")
		}
	})
	return err
}

// relayMain is the relay process: it publishes the outbox's rows until
// SIGTERM (or a SIGKILL, which it never sees).
func relayMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelWarn}))
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(outbox.Redact(err.Error()))
		return 1
	}
	defer db.Close()
	pub, err := publisher.New(os.Getenv("AMQP_URL"), publisher.WithLogger(logger))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer pub.Close()
	// The schema is the shop's, which named it in relayEnv.
	ob, err := outbox.New(db, outbox.WithTable(os.Getenv(relayEnv)+".outbox"), outbox.WithLogger(logger))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("publishing the outbox")
	// A short lease, so that the rows a SIGKILLed relay had claimed are
	// taken again within seconds, not the default minute (the lease must
	// exceed the publish timeout, which bounds a confirm's wait).
	if err := ob.Relay(pub, outbox.WithPublishTimeout(5*time.Second), outbox.WithLease(10*time.Second)).Run(ctx); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("stopped")
	return 0
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

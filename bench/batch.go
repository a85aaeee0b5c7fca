package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the PostgreSQL driver
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The batch section: a handler that writes each message to PostgreSQL with
// its own INSERT, against listener.NewBatch writing a batch with one
// multi-row INSERT, against a raw amqp091-go loop doing the same batched
// INSERTs and acking each batch with one multiple ack.
const (
	benchBatchSize = 100
	// perMessageShare: the per-message variant, at a tenth of the others'
	// speed or less, runs on a fifth of the section's messages.
	perMessageShare = 5
	// benchBatchWait ends a partial batch: the queue is filled before each
	// run, so only the last batch of each consumer is partial, and it waits
	// this long (raw and listener alike).
	benchBatchWait = 20 * time.Millisecond
)

// BatchResult is the batch section: the three variants, and the goals of
// issue 28.
type BatchResult struct {
	Runs      *Comparison `json:"runs"`
	BatchSize int         `json:"batch_size"`
	WaitMS    float64     `json:"wait_ms"`
	Goals     []Goal      `json:"goals"`
}

// batchBench is the database side of the section: a schema of the run's
// own, with a fresh table for each run, dropped at the end.
type batchBench struct {
	db     *sql.DB
	schema string
	mu     sync.Mutex
	tables int
}

// rowsTable is one run's table, with its INSERT statements built once:
// insert[n] writes n rows.
type rowsTable struct {
	name   string
	insert [benchBatchSize + 1]string
}

func measureBatch(ctx context.Context, e *env) (_ *BatchResult, err error) {
	db, err := sql.Open("pgx", e.cfg.DSN)
	if err == nil {
		err = db.PingContext(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("no PostgreSQL at %s: %v (start one with scripts/postgres.sh, set DATABASE_URL, or -skip batch)",
			outbox.Redact(e.cfg.DSN), outbox.Redact(err.Error()))
	}
	defer db.Close()
	var r [4]byte
	_, _ = rand.Read(r[:])
	b := &batchBench{db: db, schema: "amqpretry_bench_batch_" + hex.EncodeToString(r[:])}
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA `+b.schema); err != nil {
		return nil, err
	}
	defer func() {
		_, dropErr := db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA `+b.schema+` CASCADE`)
		err = errors.Join(err, dropErr)
	}()
	c, err := compare(ctx, e, sectionBatch, b.variants(e), e.cfg.BatchMessages)
	if err != nil {
		return nil, err
	}
	res := &BatchResult{Runs: c, BatchSize: benchBatchSize, WaitMS: float64(benchBatchWait.Milliseconds())}
	for _, g := range []Goal{
		{Section: sectionBatch, Variant: "batch-handler", Measure: "msg/s", Against: "per-message", Limit: 3},
		{Section: sectionBatch, Variant: "batch-handler", Measure: "msg/s", Against: "raw-batched", Limit: 0.9},
	} {
		res.Goals = append(res.Goals, g.evaluate(c))
	}
	return res, nil
}

// insertRows is the INSERT of n rows into table.
func insertRows(table string, n int) string {
	var sb strings.Builder
	sb.WriteString("INSERT INTO " + table + " (body) VALUES ")
	for i := 1; i <= n; i++ {
		if i > 1 {
			sb.WriteByte(',')
		}
		sb.WriteString("($" + strconv.Itoa(i) + ")")
	}
	return sb.String()
}

func (b *batchBench) variants(e *env) []variant {
	vs := b.all(e.cfg.Consumers, e.cfg.Prefetch)
	for i := range vs {
		vs[i].skip = e.cfg.Skip[vs[i].name]
	}
	return vs
}

func batchVariantNames() []string {
	var names []string
	for _, v := range (&batchBench{}).all(0, 0) {
		names = append(names, v.name)
	}
	return names
}

func (b *batchBench) all(c, p int) []variant {
	return []variant{
		{name: "raw-batched", run: b.raw,
			about: fmt.Sprintf("amqp091-go: %d consumers with Qos(%d), each collecting %d deliveries (or what came within %v), one multi-row INSERT, then one Ack(multiple=true)",
				c, p, benchBatchSize, benchBatchWait)},
		{name: "raw-batched-ack-each", run: b.rawAckEach,
			about: "as raw-batched, but acking each delivery of the batch on its own, as the listener does without ack coalescing: what a multiple ack saves"},
		{name: "per-message", run: b.perMessage, share: perMessageShare,
			about: fmt.Sprintf("listener.New, Chain(Retry(5), Recover(Republish)), WithConcurrentConsumers(%d), WithPrefetch(%d): one INSERT per message", c, p)},
		{name: "batch-handler", run: b.batch,
			about: fmt.Sprintf("listener.NewBatch(..., %d, %v), the same chain and options: one multi-row INSERT per batch", benchBatchSize, benchBatchWait)},
	}
}

// newTable creates a fresh table for one run.
func (b *batchBench) newTable(ctx context.Context) (*rowsTable, error) {
	b.mu.Lock()
	b.tables++
	t := &rowsTable{name: fmt.Sprintf("%s.rows_%d", b.schema, b.tables)}
	b.mu.Unlock()
	for n := 1; n <= benchBatchSize; n++ {
		t.insert[n] = insertRows(t.name, n)
	}
	_, err := b.db.ExecContext(ctx, `CREATE TABLE `+t.name+` (id bigserial PRIMARY KEY, body bytea NOT NULL)`)
	return t, err
}

// check makes sure the run wrote every message once: a variant that lost
// or doubled rows would be fast for the wrong reason.
func (b *batchBench) check(ctx context.Context, table *rowsTable, n int) error {
	var rows int
	if err := b.db.QueryRowContext(ctx, `SELECT count(*) FROM `+table.name).Scan(&rows); err != nil {
		return err
	}
	if rows != n {
		return fmt.Errorf("%s holds %d rows, want %d", table.name, rows, n)
	}
	return nil
}

// insert writes bodies with one statement.
func (b *batchBench) insert(ctx context.Context, table *rowsTable, bodies []any) error {
	_, err := b.db.ExecContext(ctx, table.insert[len(bodies)], bodies...)
	return err
}

// raw consumes q on amqp091-go channels of its own, batching by hand and
// acking each batch with one multiple ack.
func (b *batchBench) raw(ctx context.Context, e *env, q string, n int) (s Sample, err error) {
	return b.rawWith(ctx, e, q, n, true)
}

// rawAckEach is raw with an ack per delivery.
func (b *batchBench) rawAckEach(ctx context.Context, e *env, q string, n int) (s Sample, err error) {
	return b.rawWith(ctx, e, q, n, false)
}

func (b *batchBench) rawWith(ctx context.Context, e *env, q string, n int, multiple bool) (s Sample, err error) {
	table, err := b.newTable(ctx)
	if err != nil {
		return Sample{}, err
	}
	t := newTally(n)
	cpu0 := e.cpuMark()
	conn, err := amqp.Dial(e.broker.url)
	if err != nil {
		return Sample{}, err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failure error
	defer func() {
		_ = conn.Close()
		wg.Wait()
		err = errors.Join(err, failure)
	}()
	for i := range e.cfg.Consumers {
		ch, err := conn.Channel()
		if err != nil {
			return Sample{}, err
		}
		if err := ch.Qos(e.cfg.Prefetch, 0, false); err != nil {
			return Sample{}, err
		}
		deliveries, err := ch.Consume(q, fmt.Sprint("raw-batched-", i), false, false, false, false, nil)
		if err != nil {
			return Sample{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.rawLoop(ctx, table, deliveries, t, multiple); err != nil {
				mu.Lock()
				failure = errors.Join(failure, err)
				mu.Unlock()
			}
		}()
	}
	if err := t.wait(ctx); err != nil {
		return Sample{}, err
	}
	s = sampleOf(t, cpu0)
	return s, b.check(ctx, table, n)
}

// rawLoop is one raw consumer: collect up to a batch or the wait, insert,
// ack the lot with one multiple ack (or each on its own).
func (b *batchBench) rawLoop(ctx context.Context, table *rowsTable, deliveries <-chan amqp.Delivery, t *tally, multiple bool) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	bodies := make([]any, 0, benchBatchSize)
	tags := make([]uint64, 0, benchBatchSize)
	var last amqp.Delivery
	flush := func() error {
		if len(bodies) == 0 {
			return nil
		}
		timer.Stop()
		if err := b.insert(ctx, table, bodies); err != nil {
			return err
		}
		if multiple {
			if err := last.Ack(true); err != nil {
				return err
			}
		} else {
			for _, tag := range tags {
				if err := last.Acknowledger.Ack(tag, false); err != nil {
					return err
				}
			}
		}
		t.hitN(len(bodies))
		bodies, tags = bodies[:0], tags[:0]
		return nil
	}
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return nil // the connection closed: the run is over (what is unacked goes back)
			}
			bodies, tags = append(bodies, d.Body), append(tags, d.DeliveryTag)
			last = d
			switch len(bodies) {
			case benchBatchSize:
				if err := flush(); err != nil {
					return err
				}
			case 1:
				timer.Reset(benchBatchWait)
			}
		case <-timer.C:
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// perMessage is the listener with a handler that inserts each message.
func (b *batchBench) perMessage(ctx context.Context, e *env, q string, n int) (Sample, error) {
	table, err := b.newTable(ctx)
	if err != nil {
		return Sample{}, err
	}
	insert := table.insert[1]
	return b.withListener(ctx, e, q, n, table, func(mw middleware.Middleware, t *tally, opts []listener.Option) (*listener.Listener, error) {
		return listener.New(q, mw, func(ctx context.Context, d *amqp.Delivery) error {
			if _, err := b.db.ExecContext(ctx, insert, d.Body); err != nil {
				return err
			}
			t.hit()
			return nil
		}, opts...)
	})
}

// batch is listener.NewBatch with one multi-row INSERT per batch.
func (b *batchBench) batch(ctx context.Context, e *env, q string, n int) (Sample, error) {
	table, err := b.newTable(ctx)
	if err != nil {
		return Sample{}, err
	}
	return b.withListener(ctx, e, q, n, table, func(mw middleware.Middleware, t *tally, opts []listener.Option) (*listener.Listener, error) {
		return listener.NewBatch(q, mw, func(ctx context.Context, batch []*amqp.Delivery) error {
			bodies := make([]any, len(batch))
			for i, d := range batch {
				bodies[i] = d.Body
			}
			if err := b.insert(ctx, table, bodies); err != nil {
				return err
			}
			t.hitN(len(batch))
			return nil
		}, benchBatchSize, benchBatchWait, opts...)
	})
}

// withListener runs the listener newListener builds, with the throughput
// section's chain and options, until n messages are written, and checks
// the table.
func (b *batchBench) withListener(ctx context.Context, e *env, q string, n int, table *rowsTable,
	newListener func(middleware.Middleware, *tally, []listener.Option) (*listener.Listener, error)) (s Sample, err error) {
	dlq := q + ".dlq"
	pub, done, err := e.withRecovery(dlq)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, done()) }()
	t := newTally(n)
	mw := middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer.Republish(pub, "", dlq)))
	l, err := newListener(mw, t, []listener.Option{
		listener.WithURL(e.broker.url),
		listener.WithConcurrentConsumers(e.cfg.Consumers),
		listener.WithPrefetch(e.cfg.Prefetch),
		listener.WithLogger(quietLogger()),
	})
	if err != nil {
		return Sample{}, err
	}
	cpu0 := e.cpuMark()
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- l.Run(runCtx) }()
	defer func() {
		cancel()
		err = errors.Join(err, <-ran)
	}()
	if err := t.wait(ctx); err != nil {
		return Sample{}, err
	}
	s = sampleOf(t, cpu0)
	if st := l.Stats(); st.Failed > 0 {
		return Sample{}, fmt.Errorf("%d messages failed (%d recovered)", st.Failed, st.Recovered)
	}
	return s, b.check(ctx, table, n)
}

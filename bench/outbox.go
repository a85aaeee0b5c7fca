package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the PostgreSQL driver
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/publisher"
)

// defaultDSN is the PostgreSQL scripts/postgres.sh starts.
const defaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// rawWindow is how many publishes raw keeps awaiting their confirms: a
// relay worker's default batch (outbox.WithBatchSize), so that raw
// pipelines at least as deeply as one worker does.
const rawWindow = 500

// enqueueBatch is how many rows one set-up transaction enqueues.
const enqueueBatch = 500

// OutboxResult is the outbox section: the relay draining a backlog against
// raw confirmed publishing of as many messages, and the delay from a
// business transaction's commit to its message's confirmed publish.
type OutboxResult struct {
	Throughput *Comparison    `json:"throughput"`
	Latency    *OutboxLatency `json:"commit_to_publish"`
}

// OutboxLatency: each of Messages orders committed one by one at RatePerSec
// while a relay runs; the delay is from the client's Commit returning to
// the row's sent_at (stamped once the broker confirmed the publish).
type OutboxLatency struct {
	Messages       int     `json:"messages"`
	RatePerSec     float64 `json:"rate_per_sec"`
	PollIntervalMS float64 `json:"poll_interval_ms"`
	P50MS          float64 `json:"p50_ms"`
	P90MS          float64 `json:"p90_ms"`
	P99MS          float64 `json:"p99_ms"`
	MaxMS          float64 `json:"max_ms"`
}

// outboxBench is the database side of the section: a schema of the run's
// own, dropped at the end.
type outboxBench struct {
	e      *env
	db     *sql.DB
	schema string
	body   []byte
}

func measureOutbox(ctx context.Context, e *env) (_ *OutboxResult, err error) {
	db, err := sql.Open("pgx", e.cfg.DSN)
	if err == nil {
		err = db.PingContext(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("no PostgreSQL at %s: %v (start one with scripts/postgres.sh, set DATABASE_URL, or -skip outbox)",
			outbox.Redact(e.cfg.DSN), outbox.Redact(err.Error()))
	}
	defer db.Close()
	var r [4]byte
	_, _ = rand.Read(r[:])
	b := &outboxBench{e: e, db: db, schema: "amqpretry_bench_" + hex.EncodeToString(r[:]), body: make([]byte, e.cfg.OutboxBody)}
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA `+b.schema); err != nil {
		return nil, err
	}
	defer func() {
		_, dropErr := db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA `+b.schema+` CASCADE`)
		err = errors.Join(err, dropErr)
	}()

	n := e.cfg.OutboxMessages
	c := &Comparison{Baseline: "raw-confirmed", Messages: n, Rounds: e.cfg.Rounds}
	results := []VariantResult{
		{Name: "raw-confirmed", About: fmt.Sprintf("amqp091-go: one channel in confirm mode, mandatory, persistent, %d-byte bodies, up to %d publishes awaiting their deferred confirms", len(b.body), rawWindow)},
		{Name: "outbox-relay", About: "outbox.Relay with its defaults (2 workers, each claiming batches of 500 rows under a lease in one short statement, publishing them through publisher.Publisher with no transaction open and marking them sent under the claim's token, the next batch claimed and the last one recorded while one is published), draining a backlog of committed rows; timed from Run to the last row's sent_at"},
	}
	for round := 1; round <= e.cfg.Rounds; round++ {
		for i, run := range []func(context.Context, int, int) (Sample, error){b.raw, b.relay} {
			s, err := run(ctx, n, round)
			if err != nil {
				return nil, fmt.Errorf("outbox %s, round %d: %w", results[i].Name, round, err)
			}
			e.cfg.logf("outbox round %d/%d %-14s %8.0f msg/s  %6.1f µs CPU/msg", round, e.cfg.Rounds, results[i].Name, s.MsgPerSec, s.CPUPerMsg)
			results[i].Samples = append(results[i].Samples, s)
		}
	}
	c.Variants = results
	c.summarize()

	e.cfg.logf("outbox commit-to-publish latency: %d orders at %d/s", e.cfg.OutboxLatencyMessages, outboxLatencyRate)
	lat, err := b.latency(ctx, e.cfg.OutboxLatencyMessages)
	if err != nil {
		return nil, fmt.Errorf("outbox latency: %w", err)
	}
	return &OutboxResult{Throughput: c, Latency: lat}, nil
}

// raw publishes n messages on one confirm channel with a sliding window of
// deferred confirms, and waits for the last confirm.
func (b *outboxBench) raw(ctx context.Context, n, _ int) (Sample, error) {
	q := uniqueName("outbox.raw")
	cleanup, err := b.e.broker.queues(q)
	if err != nil {
		return Sample{}, err
	}
	defer func() { _ = cleanup() }()
	conn, err := amqp.Dial(b.e.broker.url)
	if err != nil {
		return Sample{}, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return Sample{}, err
	}
	if err := ch.Confirm(false); err != nil {
		return Sample{}, err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 16))
	settleHeap()
	t := newTally(n)
	cpu0 := b.e.cpuMark()
	window := make([]*amqp.DeferredConfirmation, 0, rawWindow)
	await := func(dc *amqp.DeferredConfirmation) error {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("the broker nacked a message")
		}
		t.hit()
		return nil
	}
	t.begin()
	for i := range n {
		if len(window) == rawWindow {
			if err := await(window[0]); err != nil {
				return Sample{}, err
			}
			window = window[1:]
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
			MessageId: fmt.Sprint(i), DeliveryMode: amqp.Persistent, Body: b.body,
		})
		if err != nil {
			return Sample{}, err
		}
		window = append(window, dc)
	}
	for _, dc := range window {
		if err := await(dc); err != nil {
			return Sample{}, err
		}
	}
	select {
	case r := <-returns:
		return Sample{}, fmt.Errorf("a message was returned: %s", r.ReplyText)
	default:
	}
	if err := b.e.broker.waitDepth(ctx, q, n, 10*time.Second); err != nil {
		return Sample{}, err
	}
	return sampleOf(t, cpu0), nil
}

// newOutbox makes a fresh outbox table for one run.
func (b *outboxBench) newOutbox(ctx context.Context, name string, opts ...outbox.Option) (*outbox.Outbox, error) {
	ob, err := outbox.New(b.db, append([]outbox.Option{outbox.WithTable(b.schema + "." + name), outbox.WithLogger(quietLogger())}, opts...)...)
	if err != nil {
		return nil, err
	}
	return ob, ob.Migrate(ctx)
}

// relay fills a fresh outbox table with n committed rows (not measured),
// then runs a relay until every row is sent. The time is the database's:
// from just before Run to the last row's sent_at.
func (b *outboxBench) relay(ctx context.Context, n, round int) (Sample, error) {
	q := uniqueName("outbox.relay")
	cleanup, err := b.e.broker.queues(q)
	if err != nil {
		return Sample{}, err
	}
	defer func() { _ = cleanup() }()
	ob, err := b.newOutbox(ctx, fmt.Sprintf("throughput_%d", round))
	if err != nil {
		return Sample{}, err
	}
	for sent := 0; sent < n; {
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return Sample{}, err
		}
		for end := min(sent+enqueueBatch, n); sent < end; sent++ {
			if _, err := ob.Enqueue(ctx, tx, "", q, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: b.body}); err != nil {
				_ = tx.Rollback()
				return Sample{}, err
			}
		}
		if err := tx.Commit(); err != nil {
			return Sample{}, err
		}
	}
	if _, err := b.db.ExecContext(ctx, `VACUUM ANALYZE `+b.schema+`.throughput_`+fmt.Sprint(round)); err != nil {
		return Sample{}, err
	}
	pub, err := publisher.New(b.e.broker.url, publisher.WithLogger(quietLogger()))
	if err != nil {
		return Sample{}, err
	}
	defer pub.Close()
	settleHeap()

	var start time.Time
	if err := b.db.QueryRowContext(ctx, `SELECT clock_timestamp()`).Scan(&start); err != nil {
		return Sample{}, err
	}
	var prof *profile
	if b.e.cfg.Profile != "" {
		if prof, err = startProfile(b.e.cfg.Profile, fmt.Sprintf("outbox-relay-%dB-r%d", len(b.body), round)); err != nil {
			return Sample{}, err
		}
	}
	cpu0 := b.e.cpuMark()
	stop, done := b.runRelay(ctx, ob.Relay(pub))
	waitErr := b.waitSent(ctx, ob.Table(), n, done)
	cpu := cpuTime() - cpu0.self
	if prof != nil {
		waitErr = errors.Join(waitErr, prof.stop())
	}
	brokerCPU, brokerKnown := cpu0.brokerCPUSince()
	if err := errors.Join(waitErr, stop()); err != nil {
		return Sample{}, err
	}
	var last time.Time
	if err := b.db.QueryRowContext(ctx, `SELECT max(sent_at) FROM `+ob.Table()).Scan(&last); err != nil {
		return Sample{}, err
	}
	if err := b.e.broker.waitDepth(ctx, q, n, 10*time.Second); err != nil {
		return Sample{}, err
	}
	secs := last.Sub(start).Seconds()
	s := Sample{Messages: n, Seconds: secs, MsgPerSec: float64(n) / secs, CPUPerMsg: float64(cpu.Nanoseconds()) / 1e3 / float64(n)}
	if brokerKnown {
		s.BrokerCPUPerMsg = float64(brokerCPU.Nanoseconds()) / 1e3 / float64(n)
	}
	return s, nil
}

// runRelay runs relay in a goroutine; stop cancels it and returns Run's
// error. done is closed when Run returns, whatever the reason.
func (b *outboxBench) runRelay(ctx context.Context, relay *outbox.Relay) (stop func() error, done <-chan struct{}) {
	ctx, cancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	var runErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(finished)
		runErr = relay.Run(ctx)
	}()
	return func() error {
		cancel()
		wg.Wait()
		return runErr
	}, finished
}

// waitSent polls until n rows of table are sent, the relay stops, or the
// count stands still for stallTimeout.
func (b *outboxBench) waitSent(ctx context.Context, table string, n int, relayDone <-chan struct{}) error {
	seen, since := -1, time.Now()
	for {
		var sent int
		if err := b.db.QueryRowContext(ctx, `SELECT count(*) FROM `+table+` WHERE status = 'sent'`).Scan(&sent); err != nil {
			return err
		}
		switch {
		case sent == n:
			return nil
		case sent != seen:
			seen, since = sent, time.Now()
		case time.Since(since) > stallTimeout:
			return fmt.Errorf("stalled at %d of %d rows sent for %v", sent, n, stallTimeout)
		}
		select {
		case <-relayDone:
			return fmt.Errorf("the relay stopped with %d of %d rows sent", sent, n)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// defaultPollInterval is outbox.WithPollInterval's default, which the
// relays here keep: the bulk of a quiet system's commit-to-publish delay.
const defaultPollInterval = 50 * time.Millisecond

// outboxLatencyRate is the order rate of the latency run: steady, well
// below the relay's capacity, so the figure is the wait of a quiet system.
const outboxLatencyRate = 100

// latency commits n orders one by one at outboxLatencyRate while a relay
// with its default poll interval runs, and measures each commit-to-sent
// delay.
func (b *outboxBench) latency(ctx context.Context, n int) (*OutboxLatency, error) {
	q := uniqueName("outbox.latency")
	cleanup, err := b.e.broker.queues(q)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cleanup() }()
	ob, err := b.newOutbox(ctx, "latency")
	if err != nil {
		return nil, err
	}
	pub, err := publisher.New(b.e.broker.url, publisher.WithLogger(quietLogger()))
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	stop, done := b.runRelay(ctx, ob.Relay(pub))
	committed := make(map[int64]time.Time, n)
	err = func() error {
		tick := time.NewTicker(time.Second / outboxLatencyRate)
		defer tick.Stop()
		for range n {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
			tx, err := b.db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			id, err := ob.Enqueue(ctx, tx, "", q, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: b.body})
			if err != nil {
				_ = tx.Rollback()
				return err
			}
			if err := tx.Commit(); err != nil {
				return err
			}
			committed[id] = time.Now()
		}
		return b.waitSent(ctx, ob.Table(), n, done)
	}()
	if err := errors.Join(err, stop()); err != nil {
		return nil, err
	}
	rows, err := b.db.QueryContext(ctx, `SELECT id, sent_at FROM `+ob.Table())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var delays []float64
	for rows.Next() {
		var id int64
		var sent time.Time
		if err := rows.Scan(&id, &sent); err != nil {
			return nil, err
		}
		delays = append(delays, float64(sent.Sub(committed[id]).Microseconds())/1e3)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.Sort(delays)
	return &OutboxLatency{
		Messages: n, RatePerSec: outboxLatencyRate, PollIntervalMS: float64(defaultPollInterval.Milliseconds()),
		P50MS: percentile(delays, 50), P90MS: percentile(delays, 90), P99MS: percentile(delays, 99), MaxMS: delays[len(delays)-1],
	}, nil
}

// percentile of sorted xs, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/outbox/internal/pgsql"
	"github.com/amqpretry/amqpretry/publisher"
)

// Publisher publishes one message and returns nil only once the broker has
// confirmed it. *publisher.Publisher is one; it publishes with mandatory
// set, so a message no queue would take is an error, not a silent drop.
type Publisher interface {
	Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error
}

// Relay publishes the outbox's rows. Build it with Outbox.Relay; Run it in
// as many processes as you like.
type Relay struct {
	o   *Outbox
	pub Publisher
	cfg config
}

// Relay returns a relay that publishes through pub, with opts applied over
// the Outbox's options (WithTable is ignored: a relay works on its Outbox's
// table). Invalid options make Run fail at once.
func (o *Outbox) Relay(pub Publisher, opts ...Option) *Relay {
	cfg := o.cfg
	cfg.errs = nil
	for _, opt := range opts {
		opt(&cfg)
	}
	cfg.table = o.cfg.table
	if pub == nil {
		cfg.fail("Relay: the publisher is nil: pass a *publisher.Publisher")
	}
	return &Relay{o: o, pub: pub, cfg: cfg}
}

// dbTimeout bounds each database statement of a relay, so that a database
// that hangs (rather than refusing) is noticed and waited out like one that
// is down.
const dbTimeout = 30 * time.Second

// Database outages are waited out with this backoff.
const (
	outageBackoffInitial = 100 * time.Millisecond
	outageBackoffMax     = 5 * time.Second
)

// Run publishes due rows until ctx ends, then returns nil. It returns an
// error only for invalid options or when the publisher is closed under it.
// A database that fails is logged, waited out with backoff and resumed.
//
// Run drives WithWorkers loops (default 2), each claiming its own batches,
// so that one batch is published while the previous one is recorded; they
// start a fraction of WithPollInterval apart, to spread their polls.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.cfg.err(); err != nil {
		return err
	}
	log := r.cfg.logger.With("table", r.cfg.table.Name)
	log.Info("outbox relay: started", "workers", r.cfg.workers, "poll_interval", r.cfg.pollInterval, "batch_size", r.cfg.batchSize)
	defer log.Info("outbox relay: stopped")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, r.cfg.workers)
	var wg sync.WaitGroup
	for i := range r.cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.work(ctx, i, log); err != nil {
				errs <- err
				cancel() // the others stop too
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when none failed
}

// work is one worker's loop; worker 0 also deletes sent rows past the
// retention.
func (r *Relay) work(ctx context.Context, worker int, log *slog.Logger) error {
	if worker > 0 && !sleep(ctx, r.cfg.pollInterval*time.Duration(worker)/time.Duration(r.cfg.workers)) {
		return nil
	}
	outages := 0
	var outageStart time.Time
	nextCleanup := time.Now()
	for {
		if ctx.Err() != nil {
			return nil
		}
		if worker == 0 && r.cfg.retention > 0 && !time.Now().Before(nextCleanup) {
			r.cleanup(ctx)
			nextCleanup = time.Now().Add(r.cfg.cleanupEvery)
		}
		more, err := r.pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, publisher.ErrClosed) {
			return fmt.Errorf("outbox relay: %w: the relay needs an open publisher until Run returns", err)
		}
		if err != nil {
			if outages == 0 {
				outageStart = time.Now()
			}
			outages++
			wait := backoff(outages, outageBackoffInitial, outageBackoffMax)
			var unreachable *brokerUnreachableError
			if errors.As(err, &unreachable) {
				log.Warn("outbox relay: the broker is unreachable; the rows stay in flight and no try is counted; waiting",
					"worker", worker, "rows", unreachable.rows, "error", pgsql.Redact(err.Error()), "retry_in", wait, "failures", outages)
			} else if pgsql.UndefinedTable(err) {
				log.Error("outbox relay: the outbox table does not exist: run Outbox.Migrate, or apply Outbox.Schema; waiting",
					"worker", worker, "error", pgsql.Redact(err.Error()), "retry_in", wait)
			} else {
				log.Warn("outbox relay: cannot reach the outbox table; waiting", "worker", worker, "error", pgsql.Redact(err.Error()), "retry_in", wait, "failures", outages)
			}
			if !sleep(ctx, wait) {
				return nil
			}
			continue
		}
		if outages > 0 {
			log.Info("outbox relay: the outage is over; resumed", "worker", worker, "after", since(outageStart), "failures", outages)
			outages = 0
		}
		if !more && !sleep(ctx, r.cfg.pollInterval) {
			return nil
		}
	}
}

// claimed is one row taken by a pass.
type claimed struct {
	id        int64
	messageID string
	exchange  string
	key       string
	msg       amqp.Publishing
	tries     int   // failed publishes before this one
	bad       error // the properties do not decode: fail the row as it is
	result    error
	attempted bool
}

// pass claims due rows, publishes them and records the outcome, in one
// transaction, and reports whether more rows may be due: it locked a full
// batch, or WithMaxBatchBytes cut the batch short. The row locks keep any
// other relay off these rows until the outcome is committed.
func (r *Relay) pass(ctx context.Context) (more bool, err error) {
	// The transaction outlives a cancelled ctx by up to one publish and one
	// statement, so that confirms already received are recorded: a row
	// confirmed but not marked would be sent again.
	txCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.publishTimeout+2*dbTimeout)
	defer cancel()
	tx, err := r.o.db.BeginTx(txCtx, nil)
	if err != nil {
		return false, pgsql.RedactErr(err)
	}
	defer func() { _ = tx.Rollback() }() // after Commit, a no-op

	rows, locked, err := r.claim(ctx, tx)
	if err != nil || len(rows) == 0 {
		return false, err
	}
	r.publish(ctx, rows)

	stmtCtx, cancelStmt := context.WithTimeout(txCtx, dbTimeout)
	defer cancelStmt()
	halt, err := r.record(ctx, stmtCtx, tx, rows)
	if err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		r.cfg.logger.Warn("outbox relay: commit failed; confirmed rows stay in flight and will be sent again (consumers deduplicate on MessageId)",
			"table", r.cfg.table.Name, "rows", len(rows), "error", pgsql.Redact(err.Error()))
		return false, pgsql.RedactErr(err)
	}
	// A batch that WithMaxBatchBytes cut short left due rows behind: the
	// worker must not wait a poll interval before taking them.
	more = locked >= r.cfg.batchSize || len(rows) < locked
	return more, halt
}

// brokerUnreachableError: publishes of a pass found the publisher without a
// connection (publisher.ErrNotConnected). Those rows stay due with no try
// counted, since the broker, not the message, is at fault: an outage longer
// than the retry schedule must not fail every pending row. The relay waits
// it out like a database outage.
type brokerUnreachableError struct {
	rows  int
	cause error
}

func (e *brokerUnreachableError) Error() string {
	return fmt.Sprintf("outbox relay: the publisher has no connection to the broker: %d rows stay in flight, no try counted: %v", e.rows, e.cause)
}

func (e *brokerUnreachableError) Unwrap() error { return e.cause }

// errNotRead marks a claimed row whose message the second query did not
// return; it cannot happen while the row is locked, and is failed, never
// published empty, if it does.
var errNotRead = errors.New("outbox: the row's message could not be read back in the pass that claimed it")

// claim locks up to a batch of due rows, then reads the messages of those
// that fit WithMaxBatchBytes.
func (r *Relay) claim(ctx context.Context, tx *sql.Tx) (rows []*claimed, locked int, err error) {
	qctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	rs, err := tx.QueryContext(qctx, `SELECT id, message_id, exchange, routing_key, retried_count,
	octet_length(body) + octet_length(properties)
	FROM `+r.cfg.table.Quoted+`
	WHERE status = 'in_flight' AND next_retry_at <= now()
	ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, r.cfg.batchSize)
	if err != nil {
		return nil, 0, pgsql.RedactErr(err)
	}
	defer rs.Close()
	var out []*claimed
	byID := map[int64]*claimed{}
	var ids []string
	var total int64
	for rs.Next() {
		c := &claimed{bad: errNotRead}
		var size int64
		if err := rs.Scan(&c.id, &c.messageID, &c.exchange, &c.key, &c.tries, &size); err != nil {
			return nil, 0, pgsql.RedactErr(err)
		}
		locked++
		if total += size; len(out) > 0 && total > r.cfg.maxBatchBytes {
			continue // locked until this pass commits, then due again
		}
		out = append(out, c)
		byID[c.id] = c
		ids = append(ids, strconv.FormatInt(c.id, 10))
	}
	if err := rs.Err(); err != nil {
		return nil, 0, pgsql.RedactErr(err)
	}
	rs.Close()
	if len(out) == 0 {
		return nil, 0, nil
	}
	rs, err = tx.QueryContext(qctx, `SELECT id, properties, body FROM `+r.cfg.table.Quoted+
		` WHERE id = ANY($1::bigint[])`, "{"+strings.Join(ids, ",")+"}")
	if err != nil {
		return nil, 0, pgsql.RedactErr(err)
	}
	defer rs.Close()
	for rs.Next() {
		var id int64
		var props, body []byte
		if err := rs.Scan(&id, &props, &body); err != nil {
			return nil, 0, pgsql.RedactErr(err)
		}
		c := byID[id]
		c.msg, c.bad = decodeProperties(props)
		c.msg.MessageId = c.messageID
		c.msg.Body = body
	}
	if err := rs.Err(); err != nil {
		return nil, 0, pgsql.RedactErr(err)
	}
	return out, locked, nil
}

// publish sends the rows in id order, up to the concurrency limit awaiting
// confirms at once, and waits for every publish to end.
func (r *Relay) publish(ctx context.Context, rows []*claimed) {
	limit := r.cfg.concurrency
	if limit == 0 {
		limit = r.cfg.batchSize
	}
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, c := range rows {
		if c.bad != nil {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return // the rest stay in flight, untouched
		}
		c.attempted = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c.result = r.publishOne(ctx, c)
		}()
	}
}

func (r *Relay) publishOne(ctx context.Context, c *claimed) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("outbox relay: the publisher panicked: %v", v)
		}
	}()
	pctx, cancel := context.WithTimeout(ctx, r.cfg.publishTimeout)
	defer cancel()
	return r.pub.Publish(pctx, c.exchange, c.key, c.msg)
}

// record writes each attempted row's outcome. It returns publisher.ErrClosed
// (after recording the rest) if the publisher was closed under the relay.
func (r *Relay) record(runCtx, ctx context.Context, tx *sql.Tx, rows []*claimed) (halt error, err error) {
	var sent []string
	var closed error
	var unreachable *brokerUnreachableError
	for _, c := range rows {
		switch {
		case c.bad != nil:
			if err := r.fail(ctx, tx, c, c.bad, true); err != nil {
				return nil, err
			}
		case !c.attempted:
		case c.result == nil:
			sent = append(sent, strconv.FormatInt(c.id, 10))
		case errors.Is(c.result, publisher.ErrClosed):
			closed = c.result
		case runCtx.Err() != nil:
			// Shutdown cut the wait for the confirm: not the message's fault,
			// so not a try; the row stays due.
		case errors.Is(c.result, publisher.ErrNotConnected):
			if unreachable == nil {
				unreachable = &brokerUnreachableError{cause: c.result}
			}
			unreachable.rows++
		default:
			if err := r.fail(ctx, tx, c, c.result, errors.Is(c.result, publisher.ErrInvalidMessage)); err != nil {
				return nil, err
			}
		}
	}
	if len(sent) > 0 {
		// The ids go as one array literal, which every driver passes as text.
		_, err := tx.ExecContext(ctx, `UPDATE `+r.cfg.table.Quoted+`
		SET status = 'sent', sent_at = clock_timestamp(), last_error = NULL
		WHERE id = ANY($1::bigint[])`, "{"+strings.Join(sent, ",")+"}")
		if err != nil {
			return nil, pgsql.RedactErr(err)
		}
	}
	if closed != nil {
		return closed, nil
	}
	if unreachable != nil {
		return unreachable, nil
	}
	return nil, nil
}

// fail counts a failed try of c: due again after the backoff, or failed
// for good at the limit (or at once when trying again cannot help).
func (r *Relay) fail(ctx context.Context, tx *sql.Tx, c *claimed, cause error, hopeless bool) error {
	tries := c.tries + 1
	final := hopeless || tries >= r.cfg.maxTries
	delay := backoff(tries, r.cfg.initialBackoff, r.cfg.maxBackoff)
	status := StatusInFlight
	if final {
		status = StatusFailed
	}
	reason := lastError(cause)
	_, err := tx.ExecContext(ctx, `UPDATE `+r.cfg.table.Quoted+`
	SET retried_count = retried_count + 1, last_error = $2, status = $3,
	    next_retry_at = clock_timestamp() + $4::bigint * interval '1 millisecond'
	WHERE id = $1`, c.id, reason, string(status), delay.Milliseconds())
	if err != nil {
		return pgsql.RedactErr(err)
	}
	attrs := []any{"table", r.cfg.table.Name, "id", c.id, "message_id", c.messageID, "exchange", c.exchange,
		"routing_key", c.key, "tries", tries, "error", reason}
	if final {
		r.cfg.logger.Error("outbox relay: row failed; it waits for a person (fix the cause, then Retry it)", attrs...)
	} else {
		r.cfg.logger.Warn("outbox relay: publish failed; will try again", append(attrs, "retry_in", delay)...)
	}
	return nil
}

// maxLastError bounds the stored reason; the start says what happened.
const maxLastError = 4096

// lastError is cause's text as PostgreSQL text accepts it: valid UTF-8,
// no NUL, bounded, passwords hidden.
func lastError(cause error) string {
	s := pgsql.Redact(cause.Error())
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) > maxLastError {
		cut := maxLastError
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// cleanup deletes sent rows past the retention, a bounded batch at a time,
// so that no statement holds many locks or runs long.
func (r *Relay) cleanup(ctx context.Context) {
	const batch, maxBatches = 1000, 100
	total := int64(0)
	for range maxBatches {
		qctx, cancel := context.WithTimeout(ctx, dbTimeout)
		res, err := r.o.db.ExecContext(qctx, `DELETE FROM `+r.cfg.table.Quoted+` WHERE id IN (
		SELECT id FROM `+r.cfg.table.Quoted+`
		WHERE status = 'sent' AND sent_at < now() - $1::bigint * interval '1 millisecond'
		LIMIT $2)`, r.cfg.retention.Milliseconds(), batch)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.cfg.logger.Warn("outbox relay: cleanup of sent rows failed; will try again", "table", r.cfg.table.Name, "error", pgsql.Redact(err.Error()))
			}
			return
		}
		n, _ := res.RowsAffected()
		total += n
		if n < batch {
			break
		}
	}
	if total > 0 {
		r.cfg.logger.Debug("outbox relay: deleted sent rows past the retention", "table", r.cfg.table.Name, "rows", total, "retention", r.cfg.retention)
	}
}

// backoff is initial·2^(n-1), capped at max.
func backoff(n int, initial, max time.Duration) time.Duration {
	d := initial
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// sleep waits d or until ctx ends; false means ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

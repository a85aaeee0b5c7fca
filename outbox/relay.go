package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
//
// Once ctx ends, Run starts no publish and claims nothing more; it waits up
// to WithShutdownTimeout for the confirms of what it has sent, records them,
// and hands back the rows it claimed but did not publish.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.cfg.err(); err != nil {
		return err
	}
	log := r.cfg.logger.With("table", r.cfg.table.Name)
	log.Info("outbox relay: started", "workers", r.cfg.workers, "poll_interval", r.cfg.pollInterval, "batch_size", r.cfg.batchSize, "lease", r.cfg.leaseFor())
	defer log.Info("outbox relay: stopped")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// grace outlives ctx by the shutdown timeout: the publishes already sent
	// wait for their confirms under it, and their outcomes are recorded.
	grace, endGrace := context.WithCancel(context.WithoutCancel(ctx))
	defer endGrace()
	workersDone := make(chan struct{})
	var timerWG sync.WaitGroup
	timerWG.Add(1)
	go func() {
		defer timerWG.Done()
		select {
		case <-ctx.Done():
		case <-workersDone:
			return
		}
		t := time.NewTimer(r.cfg.shutdown)
		defer t.Stop()
		select {
		case <-t.C:
			endGrace()
		case <-workersDone:
		}
	}()

	errs := make(chan error, r.cfg.workers)
	var wg sync.WaitGroup
	for i := range r.cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.work(ctx, grace, i, log); err != nil {
				errs <- err
				cancel() // the others stop too
			}
		}()
	}
	wg.Wait()
	close(workersDone)
	timerWG.Wait()
	close(errs)
	return <-errs // nil when none failed
}

// work is one worker's loop; worker 0 also deletes sent rows past the
// retention.
func (r *Relay) work(ctx, grace context.Context, worker int, log *slog.Logger) error {
	if worker > 0 && !sleep(ctx, r.cfg.pollInterval*time.Duration(worker)/time.Duration(r.cfg.workers)) {
		return nil
	}
	outages := 0
	var outageStart time.Time
	nextCleanup := time.Now()
	var next *batch          // claimed while the last batch was published
	var recording *recording // the last batch's outcomes being written
	defer func() {
		_ = recording.wait()
		if next != nil { // hand it back: due at once for the next relay
			_, _ = r.record(ctx, grace, next.rows, next.token, next.leaseEnd)
		}
	}()
	for {
		if ctx.Err() != nil {
			return nil
		}
		if worker == 0 && r.cfg.retention > 0 && !time.Now().Before(nextCleanup) {
			r.cleanup(ctx)
			nextCleanup = time.Now().Add(r.cfg.cleanupEvery)
		}
		var more bool
		var err error
		more, next, recording, err = r.pass(ctx, grace, next, recording)
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
		if !more && next == nil && !sleep(ctx, r.cfg.pollInterval) {
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

// batch is the rows one claim leased, under token until leaseEnd.
type batch struct {
	rows     []*claimed
	found    int // due rows the claim found, WithMaxBatchBytes's cut included
	token    int64
	leaseEnd time.Time
}

// claimBatch leases a batch of due rows; nil when none is due.
func (r *Relay) claimBatch(ctx context.Context) (*batch, error) {
	token := newToken()
	lease := r.cfg.leaseFor()
	claimedAt := time.Now() // before the claim: the lease ends no earlier than this says
	rows, found, err := r.claim(ctx, token, lease)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return &batch{rows: rows, found: found, token: token, leaseEnd: claimedAt.Add(lease)}, nil
}

// pass publishes a batch, cur, claiming it first if it is nil, and starts
// recording the outcomes, which it returns as rec. It reports whether more
// rows may be due: the claim found a full batch, or WithMaxBatchBytes cut
// it short; then, while it publishes, it claims the next batch and returns
// it. So claiming, publishing and recording overlap, as the database and the
// broker work in parallel; prev, the last pass's recording, is waited for
// before this one starts, and its error returned.
//
// The claim sets the rows' claim to a token of its own and their
// next_retry_at to the lease's end, so no relay takes them while it lasts;
// every later statement on them names the token, so once the lease has
// lapsed and another relay has claimed a row, nothing this pass learns is
// written to it.
func (r *Relay) pass(ctx, grace context.Context, cur *batch, prev *recording) (more bool, next *batch, rec *recording, err error) {
	if cur == nil {
		if cur, err = r.claimBatch(ctx); cur == nil {
			return false, nil, nil, errors.Join(err, prev.wait())
		}
	}
	more = cur.found >= r.cfg.batchSize || len(cur.rows) < cur.found
	var claimErr error
	claimed := make(chan struct{})
	if more && ctx.Err() == nil {
		// Under grace, not ctx: a claim cut short by shutdown after the
		// database ran it would leave its rows leased, unpublished, until
		// the lease ends; one that finishes is handed back by work.
		go func() {
			defer close(claimed)
			next, claimErr = r.claimBatch(grace)
		}()
	} else {
		close(claimed)
	}
	r.publish(ctx, grace, cur.rows, cur.leaseEnd)
	prevErr := prev.wait()
	rec = &recording{done: make(chan struct{})}
	go func() {
		defer close(rec.done)
		rec.halt, rec.err = r.record(ctx, grace, cur.rows, cur.token, cur.leaseEnd)
	}()
	<-claimed // the claim ends within dbTimeout, or with grace
	return more, next, rec, errors.Join(prevErr, claimErr)
}

// recording is a batch's outcomes being written by record.
type recording struct {
	done      chan struct{}
	halt, err error
}

// wait waits for the recording to end (it does within the lease, or with
// grace) and returns its error; a nil recording has none.
func (rec *recording) wait() error {
	if rec == nil {
		return nil
	}
	<-rec.done
	return errors.Join(rec.err, rec.halt)
}

// newToken returns a random claim token.
func newToken() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24)
	return int64(binary.BigEndian.Uint64(b[:]) >> 1)
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

// claim leases up to a batch of due rows, in id order, in one statement
// (so one short transaction): it locks the due rows it can (SKIP LOCKED:
// another relay's claim in progress keeps its own), keeps those that fit
// WithMaxBatchBytes (the first always), stamps them with token and the
// lease's end, and returns their messages. found is how many due rows it
// locked, kept or not.
func (r *Relay) claim(ctx context.Context, token int64, lease time.Duration) (rows []*claimed, found int, err error) {
	qctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	rs, err := r.o.db.QueryContext(qctx, `WITH due AS (
	SELECT id, octet_length(body) + octet_length(properties) AS size
	FROM `+r.cfg.table.Quoted+`
	WHERE status = 'in_flight' AND next_retry_at <= now()
	ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
), fit AS (
	SELECT id FROM (SELECT id, sum(size) OVER (ORDER BY id) AS total, row_number() OVER (ORDER BY id) AS n FROM due) s
	WHERE n = 1 OR total <= $2::bigint
)
UPDATE `+r.cfg.table.Quoted+` AS t
SET claim = $3, next_retry_at = clock_timestamp() + $4::bigint * interval '1 millisecond'
FROM fit WHERE t.id = fit.id
RETURNING t.id, t.message_id, t.exchange, t.routing_key, t.retried_count, t.properties, t.body, (SELECT count(*) FROM due)`,
		r.cfg.batchSize, r.cfg.maxBatchBytes, token, lease.Milliseconds())
	if err != nil {
		return nil, 0, pgsql.RedactErr(err)
	}
	defer rs.Close()
	for rs.Next() {
		c := &claimed{}
		var props, body []byte
		if err := rs.Scan(&c.id, &c.messageID, &c.exchange, &c.key, &c.tries, &props, &body, &found); err != nil {
			return nil, 0, pgsql.RedactErr(err)
		}
		c.msg, c.bad = decodeProperties(props)
		c.msg.MessageId = c.messageID
		c.msg.Body = body
		rows = append(rows, c)
	}
	if err := rs.Err(); err != nil {
		return nil, 0, pgsql.RedactErr(err)
	}
	slices.SortFunc(rows, func(a, b *claimed) int { return cmp.Compare(a.id, b.id) })
	return rows, found, nil
}

// publish sends the rows in id order, up to the concurrency limit awaiting
// confirms at once, and waits for every publish to end. It starts none
// once ctx has ended, nor one that could not end (WithPublishTimeout)
// within the lease with a margin to record it; those rows stay
// unattempted. A publish runs under grace, so one already sent when ctx
// ends still gets its confirm, up to the shutdown timeout.
func (r *Relay) publish(ctx, grace context.Context, rows []*claimed, leaseEnd time.Time) {
	limit := r.cfg.concurrency
	if limit == 0 {
		limit = r.cfg.batchSize
	}
	sem := make(chan struct{}, limit)
	ended := make(chan struct{}, len(rows))
	started := 0
	defer func() {
		for range started {
			<-ended // each publish ends by its timeout, or with grace
		}
	}()
	for _, c := range rows {
		if c.bad != nil {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return // the rest stay unattempted
		}
		if ctx.Err() != nil || time.Until(leaseEnd) < r.cfg.publishTimeout+leaseMargin {
			return
		}
		c.attempted = true
		started++
		go func() {
			defer func() { ended <- struct{}{} }()
			defer func() { <-sem }()
			c.result = r.publishOne(grace, c)
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
	// A row no queue takes is an error to retry and, past the limit, a
	// failed row for a person: never a silent loss, whatever the
	// publisher's default (publisher.WithMandatory).
	return r.pub.Publish(publisher.WithMandatoryContext(pctx, true), c.exchange, c.key, c.msg)
}

// outcome is what record writes to a row that was not sent: a failed try
// (tries 1, with the reason, due again after delay or failed for good), or
// the claim handed back (tries 0: due at once, nothing else changed).
type outcome struct {
	ID      int64   `json:"id"`
	Tries   int     `json:"tries"`
	Reason  *string `json:"reason"`
	Status  Status  `json:"status"`
	DelayMS int64   `json:"delay_ms"`
}

// record writes each claimed row's outcome, under this pass's token: the
// confirmed rows sent, failed tries counted, the rest handed back. It
// returns publisher.ErrClosed if the publisher was closed under the relay,
// or a *brokerUnreachableError, after recording. A database that fails is
// retried until the lease ends: the confirms are known, and losing them
// would send the rows again.
func (r *Relay) record(ctx, grace context.Context, rows []*claimed, token int64, leaseEnd time.Time) (halt error, err error) {
	var sent []string
	var outcomes []outcome
	var closed error
	var unreachable *brokerUnreachableError
	release := func(c *claimed) { outcomes = append(outcomes, outcome{ID: c.id, Status: StatusInFlight}) }
	for _, c := range rows {
		switch {
		case c.bad != nil:
			outcomes = append(outcomes, r.failure(c, c.bad, true))
		case !c.attempted:
			release(c)
		case c.result == nil:
			sent = append(sent, strconv.FormatInt(c.id, 10))
		case errors.Is(c.result, publisher.ErrClosed):
			closed = c.result
			release(c)
		case ctx.Err() != nil && errors.Is(c.result, context.Canceled):
			// The shutdown timeout cut the wait for the confirm: not the
			// message's fault, so not a try.
			release(c)
		case errors.Is(c.result, publisher.ErrNotConnected):
			if unreachable == nil {
				unreachable = &brokerUnreachableError{cause: c.result}
			}
			unreachable.rows++
			release(c)
		default:
			var refused *publisher.ChannelError
			hopeless := errors.Is(c.result, publisher.ErrInvalidMessage) || errors.As(c.result, &refused)
			outcomes = append(outcomes, r.failure(c, c.result, hopeless))
		}
	}
	outages := 0
	var outageStart time.Time
	for {
		err = r.write(grace, &sent, outcomes, token)
		if err == nil {
			break
		}
		if outages == 0 {
			outageStart = time.Now()
		}
		outages++
		wait := backoff(outages, outageBackoffInitial, outageBackoffMax)
		if grace.Err() != nil || time.Now().Add(wait).After(leaseEnd) {
			r.cfg.logger.Warn("outbox relay: cannot reach the outbox table to record published rows; they stay claimed until the lease ends, then are sent again (consumers deduplicate on MessageId)",
				"table", r.cfg.table.Name, "rows", len(rows), "confirmed", len(sent), "error", pgsql.Redact(err.Error()))
			return nil, err
		}
		r.cfg.logger.Warn("outbox relay: cannot reach the outbox table to record published rows; retrying within the lease",
			"table", r.cfg.table.Name, "rows", len(rows), "error", pgsql.Redact(err.Error()), "retry_in", wait, "failures", outages)
		if !sleep(grace, wait) {
			return nil, err
		}
	}
	if outages > 0 {
		r.cfg.logger.Info("outbox relay: the outage is over; recorded the published rows and resumed", "table", r.cfg.table.Name, "after", since(outageStart), "failures", outages)
	}
	if closed != nil {
		return closed, nil
	}
	if unreachable != nil {
		return unreachable, nil
	}
	return nil, nil
}

// write runs record's statements, each alone (so in a short transaction of
// its own), the confirmed rows first; once those are written it empties
// *sent, so that a retry does not repeat them.
func (r *Relay) write(grace context.Context, sent *[]string, outcomes []outcome, token int64) error {
	ctx, cancel := context.WithTimeout(grace, dbTimeout)
	defer cancel()
	if len(*sent) > 0 {
		// The ids go as one array literal, which every driver passes as text.
		res, err := r.o.db.ExecContext(ctx, `UPDATE `+r.cfg.table.Quoted+`
		SET status = 'sent', sent_at = clock_timestamp(), next_retry_at = clock_timestamp(), last_error = NULL, claim = NULL
		WHERE id = ANY($1::bigint[]) AND claim = $2 AND status = 'in_flight'`, "{"+strings.Join(*sent, ",")+"}", token)
		if err != nil {
			return pgsql.RedactErr(err)
		}
		if n, err := res.RowsAffected(); err == nil && int(n) < len(*sent) {
			r.cfg.logger.Warn("outbox relay: confirmed rows were claimed by another relay after this one's lease lapsed; they are not marked here, and are sent again (consumers deduplicate on MessageId)",
				"table", r.cfg.table.Name, "confirmed", len(*sent), "marked", n)
		}
		*sent = nil
	}
	if len(outcomes) > 0 {
		// Every outcome in one statement, as JSON, which every driver passes
		// as text.
		data, err := json.Marshal(outcomes)
		if err != nil {
			return err
		}
		_, err = r.o.db.ExecContext(ctx, `UPDATE `+r.cfg.table.Quoted+` AS t
		SET retried_count = t.retried_count + o.tries, last_error = COALESCE(o.reason, t.last_error), status = o.status,
		    next_retry_at = clock_timestamp() + o.delay_ms * interval '1 millisecond', claim = NULL
		FROM jsonb_to_recordset($1::jsonb) AS o(id bigint, tries integer, reason text, status text, delay_ms bigint)
		WHERE t.id = o.id AND t.claim = $2 AND t.status = 'in_flight'`, string(data), token)
		if err != nil {
			return pgsql.RedactErr(err)
		}
	}
	return nil
}

// failure is a failed try of c: due again after the backoff, or failed for
// good at the limit (or at once when trying again cannot help). It logs it.
func (r *Relay) failure(c *claimed, cause error, hopeless bool) outcome {
	tries := c.tries + 1
	final := hopeless || tries >= r.cfg.maxTries
	delay := backoff(tries, r.cfg.initialBackoff, r.cfg.maxBackoff)
	status := StatusInFlight
	if final {
		status = StatusFailed
	}
	reason := lastError(cause)
	attrs := []any{"table", r.cfg.table.Name, "id", c.id, "message_id", c.messageID, "exchange", c.exchange,
		"routing_key", c.key, "tries", tries, "error", reason}
	if final {
		r.cfg.logger.Error("outbox relay: row failed; it waits for a person (fix the cause, then Retry it)", attrs...)
	} else {
		r.cfg.logger.Warn("outbox relay: publish failed; will try again", append(attrs, "retry_in", delay)...)
	}
	return outcome{ID: c.id, Tries: 1, Reason: &reason, Status: status, DelayMS: delay.Milliseconds()}
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

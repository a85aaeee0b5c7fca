package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/handoff"
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
	o     *Outbox
	pub   Publisher
	async asyncPublisher // pub, when it is a *publisher.Publisher
	cfg   config
}

// asyncPublisher is what a *publisher.Publisher offers beyond Publisher: a
// publish whose outcome comes to a callback, so that a relay keeps many
// rows in flight without a goroutine parked on each confirm.
type asyncPublisher interface {
	PublishAsync(ctx context.Context, exchange, key string, msg amqp.Publishing, done func(error)) error
}

// Relay returns a relay that publishes through pub, with opts applied over
// the Outbox's options (WithTable is ignored: a relay works on its Outbox's
// table). Invalid options make Run fail at once.
//
// With a *publisher.Publisher the relay publishes with its PublishAsync,
// and no goroutine waits on a confirm; any other Publisher (a wrapper of
// your own, even one that embeds a *publisher.Publisher) is called through
// Publish, by a goroutine per publish under way.
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
	r := &Relay{o: o, pub: pub}
	// Only a bare *publisher.Publisher is published to asynchronously: a
	// Publisher of the caller's own, even one that embeds one, may count,
	// trace or refuse in its Publish, which PublishAsync would bypass.
	if p, ok := pub.(*publisher.Publisher); ok {
		if p == nil { // publisher.New's error ignored, say
			cfg.fail("Relay: the publisher is a nil *publisher.Publisher: pass the one publisher.New returned without an error")
		}
		r.async = p
	}
	r.cfg = cfg
	return r
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

// shutdownRecordTimeout bounds what a stopping relay spends, once its
// shutdown timeout has ended, on writing what it has learned: the confirms
// that came in and the rows it hands back are still recorded, for up to this
// long, so that a shutdown neither sends confirmed rows again nor leaves
// rows leased to nobody.
const shutdownRecordTimeout = 5 * time.Second

// Run publishes due rows until ctx ends, then returns nil. It returns an
// error only for invalid options or when the publisher is closed under it.
// A database that fails is logged, waited out with backoff and resumed.
//
// Run drives WithWorkers loops (default 2), each claiming its own batches;
// they start a fraction of WithPollInterval apart, to spread their polls.
// A worker records each publish's outcome as its confirm arrives, and claims
// the next batch while the publishes of the last one still wait for theirs,
// so a destination slow to confirm holds up its own rows only.
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
	// wait for their confirms under it, and a claim under way finishes.
	// keep outlives grace by shutdownRecordTimeout: the outcomes are written
	// under it, so none known by the end of grace is forgotten.
	grace, endGrace := context.WithCancel(context.WithoutCancel(ctx))
	defer endGrace()
	keep, endKeep := context.WithCancel(context.WithoutCancel(ctx))
	defer endKeep()
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
		if !sleepUnless(workersDone, r.cfg.shutdown) {
			return
		}
		endGrace()
		if sleepUnless(workersDone, shutdownRecordTimeout) {
			endKeep()
		}
	}()

	errs := make(chan error, r.cfg.workers)
	var wg sync.WaitGroup
	for i := range r.cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.work(ctx, grace, keep, i, log); err != nil {
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
func (r *Relay) work(ctx, grace, keep context.Context, n int, log *slog.Logger) error {
	if n > 0 && !sleep(ctx, r.cfg.pollInterval*time.Duration(n)/time.Duration(r.cfg.workers)) {
		return nil
	}
	w := r.startWorker(grace, keep)
	defer w.stop()
	outages := 0
	var outageStart time.Time
	nextCleanup := time.Now()
	for {
		if ctx.Err() != nil {
			return nil
		}
		if n == 0 && r.cfg.retention > 0 && !time.Now().Before(nextCleanup) {
			r.cleanup(ctx)
			nextCleanup = time.Now().Add(r.cfg.cleanupEvery)
		}
		more, err := w.pass(ctx)
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
					"worker", n, "rows", unreachable.rows, "error", pgsql.Redact(err.Error()), "retry_in", wait, "failures", outages)
			} else if pgsql.UndefinedTable(err) {
				log.Error("outbox relay: the outbox table does not exist: run Outbox.Migrate, or apply Outbox.Schema; waiting",
					"worker", n, "error", pgsql.Redact(err.Error()), "retry_in", wait)
			} else {
				log.Warn("outbox relay: cannot reach the outbox table; waiting", "worker", n, "error", pgsql.Redact(err.Error()), "retry_in", wait, "failures", outages)
			}
			if !sleep(ctx, wait) {
				return nil
			}
			continue
		}
		if outages > 0 {
			log.Info("outbox relay: the outage is over; resumed", "worker", n, "after", since(outageStart), "failures", outages)
			outages = 0
		}
		if !more && !sleep(ctx, r.cfg.pollInterval) {
			return nil
		}
	}
}

// claimed is one row taken by a claim.
type claimed struct {
	id        int64
	messageID string
	exchange  string
	key       string
	msg       amqp.Publishing
	tries     int   // failed publishes before this one
	bad       error // the properties do not decode: fail the row as it is
	token     int64 // the claim's
	leaseEnd  time.Time
	attempted bool
	result    error
	cut       bool // the shutdown timeout ended the wait for the confirm
	unsent    bool // PublishAsync gave up before sending it, the message not at fault
}

// batch is the rows one claim leased.
type batch struct {
	rows  []*claimed
	found int // due rows the claim found, WithMaxBatchBytes's cut included
}

// worker is the state of one of Run's loops. The loop claims batches and
// starts their publishes, at most WithConcurrency awaiting confirms at once;
// each publish hands its row to the worker's recorder as it ends, and the
// recorder writes the outcomes that have come in, a group at a time. So
// claiming, publishing and recording overlap, and a row whose confirm is
// late holds up its own slot only.
//
// With a *publisher.Publisher the loop publishes with PublishAsync: it
// sends each row and goes on, and the confirm's callback hands the row to
// the recorder, so no goroutine waits on a confirm. With any other
// Publisher, goroutines of the worker's (at most WithConcurrency) each
// publish a row and wait for its confirm.
type worker struct {
	r          *Relay
	grace      context.Context
	publishCtx context.Context          // grace, with mandatory set
	slots      chan struct{}            // one per publish under way, given back as the recorder takes its row
	jobs       chan job                 // to the publishing goroutines
	limit      int                      // WithConcurrency
	started    int                      // publishing goroutines; dispatch's alone
	publishes  sync.WaitGroup           // the publishing goroutines, and the async publishes awaiting their outcome
	bytes      atomic.Int64             // message bytes of the publishes under way
	freed      chan struct{}            // a publish ended: bytes went down
	outcomes   *handoff.Queue[*claimed] // to the recorder: putting never waits, so a publisher's done func can put
	recorded   chan struct{}            // closed once the recorder has ended

	// win is the deadline the async publishes started last share; dispatch's
	// alone.
	win *window

	mu   sync.Mutex
	halt error // publisher.ErrClosed, or a *brokerUnreachableError
}

// startWorker starts a worker's recorder, which writes under keep.
func (r *Relay) startWorker(grace, keep context.Context) *worker {
	limit := r.cfg.concurrency
	if limit == 0 {
		limit = r.cfg.batchSize
	}
	// Through PublishAsync, the publisher's room for publishes in flight is
	// shared out among the workers: a publish that waited for room would
	// start with little of its timeout left, and hold up the worker while
	// it waited.
	if p, ok := r.async.(interface{ MaxInFlight() int }); ok {
		limit = min(limit, max(1, p.MaxInFlight()/r.cfg.workers))
	}
	w := &worker{
		r:     r,
		grace: grace,
		// A row no queue takes is an error to retry and, past the limit, a
		// failed row for a person: never a silent loss, whatever the
		// publisher's default (publisher.WithMandatory).
		publishCtx: publisher.WithMandatoryContext(grace, true),
		slots:      make(chan struct{}, limit),
		jobs:       make(chan job),
		limit:      limit,
		freed:      make(chan struct{}, 1),
		outcomes:   handoff.New[*claimed](),
		recorded:   make(chan struct{}),
	}
	go w.record(keep)
	return w
}

// stop waits for the publishes under way (each ends by its timeout, or with
// grace) and for the recorder to write their outcomes.
func (w *worker) stop() {
	close(w.jobs)
	if w.win != nil {
		w.win.release()
		w.win = nil
	}
	w.publishes.Wait()
	w.outcomes.Close()
	<-w.recorded
}

// maxRecordGroup bounds the outcomes one write takes.
const maxRecordGroup = 2000

// record writes the outcomes as they come in: whatever has arrived while
// the last write ran goes in the next. It gives back the slots of the
// published rows it takes: a database slower than the broker slows the
// publishing down rather than piling outcomes up.
func (w *worker) record(keep context.Context) {
	defer close(w.recorded)
	var group []*claimed
	for {
		group = w.outcomes.Take(group[:0], maxRecordGroup)
		if len(group) == 0 {
			return
		}
		for _, c := range group {
			if c.attempted {
				<-w.slots
			}
		}
		w.r.record(keep, group)
		clear(group)
	}
}

// pass claims a batch and starts publishing it. It reports whether more rows
// may be due (the claim found a full batch, or WithMaxBatchBytes cut it
// short), or why the worker should wait: the database failed, or a publish
// found the publisher closed or without a connection.
//
// The claim sets the rows' claim to a token of its own and their
// leased_until to the lease's end, so no relay takes them while it lasts;
// every later statement on them names the token, so once the lease has
// lapsed and another relay has claimed a row, nothing this worker learns is
// written to it.
func (w *worker) pass(ctx context.Context) (more bool, err error) {
	if err := w.takeHalt(); err != nil {
		return false, err
	}
	budget, ok := w.room(ctx)
	if !ok {
		return false, nil
	}
	b, err := w.r.claimBatch(ctx, w.grace, budget)
	if err != nil || b == nil {
		return false, err
	}
	if ctx.Err() != nil {
		w.handBack(b.rows) // due at once for the next relay
		return false, nil
	}
	w.dispatch(ctx, b)
	return b.found >= w.r.cfg.batchSize || len(b.rows) < b.found, nil
}

// room waits until the publishes under way hold at most half of
// WithMaxBatchBytes in messages, and returns what the next claim may take:
// a worker holds about WithMaxBatchBytes at most (one row more, when a
// single row is larger). false means ctx ended.
func (w *worker) room(ctx context.Context) (int64, bool) {
	limit := w.r.cfg.maxBatchBytes
	for {
		if held := w.bytes.Load(); held <= limit/2 {
			return limit - held, true
		}
		select {
		case <-w.freed:
		case <-ctx.Done():
			return 0, false
		}
	}
}

// handBack gives rows to the recorder unpublished: a row that does not
// decode is failed, the others are released, due at once.
func (w *worker) handBack(rows []*claimed) {
	for _, c := range rows {
		w.outcomes.Put(c)
	}
}

// dispatch starts the publishes of b's rows in id order, each once a slot
// is free, and returns once every row is started or handed to the recorder.
// It starts none once ctx has ended. Each publish's timeout is
// WithPublishTimeout, cut to end a margin before the lease does, so that its
// outcome is recorded while the claim holds; a row whose lease has less than
// half the publish timeout left is handed back untried. A publish runs
// under grace, so one already sent when ctx ends still gets its confirm, up
// to the shutdown timeout.
func (w *worker) dispatch(ctx context.Context, b *batch) {
	r := w.r
	for i, c := range b.rows {
		if c.bad != nil {
			w.outcomes.Put(c)
			continue
		}
		select {
		case w.slots <- struct{}{}:
		case <-ctx.Done():
			w.handBack(b.rows[i:])
			return
		}
		left := time.Until(c.leaseEnd) - leaseMargin
		if ctx.Err() != nil || left < r.cfg.publishTimeout/2 {
			<-w.slots
			if ctx.Err() == nil {
				r.cfg.logger.Warn("outbox relay: claimed rows were handed back untried: too little of their lease was left to publish them (a longer WithLease, or a higher WithConcurrency, leaves more)",
					"table", r.cfg.table.Name, "rows", len(b.rows)-i, "lease_left", time.Until(c.leaseEnd).Round(time.Millisecond), "publish_timeout", r.cfg.publishTimeout)
			}
			w.handBack(b.rows[i:])
			return
		}
		j := job{c: c, timeout: min(r.cfg.publishTimeout, left), size: int64(len(c.msg.Body))}
		w.bytes.Add(j.size)
		c.attempted = true
		if r.async != nil {
			w.publishAsync(j)
			continue
		}
		// The publishing goroutines live as long as the worker: one
		// started per row would grow its stack anew on every publish.
		if w.started < w.limit {
			select {
			case w.jobs <- j: // an idle one takes it
				continue
			default:
			}
			w.started++
			w.publishes.Add(1)
			go w.publishLoop(j)
			continue
		}
		w.jobs <- j // the slot held means one is idle, or about to be
	}
}

// job is a row to publish, with its publish's timeout.
type job struct {
	c       *claimed
	timeout time.Duration
	size    int64
}

// publishLoop publishes j, then the jobs that follow, until stop.
func (w *worker) publishLoop(j job) {
	defer w.publishes.Done()
	for ok := true; ok; j, ok = <-w.jobs {
		w.ended(j, w.r.publishOne(w.publishCtx, j.c, j.timeout))
	}
}

// publishAsync sends j's row with PublishAsync; its outcome comes to
// ended, on the publisher's completion goroutine, or at once if nothing
// was sent.
func (w *worker) publishAsync(j job) {
	win := w.windowFor(time.Now().Add(j.timeout))
	win.refs.Add(1)
	w.publishes.Add(1)
	err := w.sendAsync(win.ctx, j, func(err error) {
		w.ended(j, err)
		win.release()
		w.publishes.Done()
	})
	if err != nil {
		// Nothing was sent (PublishAsync's rule): unless the message
		// itself is invalid, this is not a try, but a wait that ran out
		// (for the publisher's room, a channel, a connection).
		j.c.unsent = !errors.Is(err, publisher.ErrInvalidMessage)
		w.ended(j, err)
		win.release()
		w.publishes.Done()
	}
}

// sendAsync is PublishAsync of j's row, with a panic turned into an error,
// as publishOne does for Publish.
func (w *worker) sendAsync(ctx context.Context, j job, done func(error)) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("outbox relay: the publisher panicked: %v", v)
		}
	}()
	return w.r.async.PublishAsync(ctx, j.c.exchange, j.c.key, j.c.msg, done)
}

// ended takes j's outcome and hands the row to the recorder. It never
// waits: it may run on the publisher's completion goroutine.
func (w *worker) ended(j job, err error) {
	c := j.c
	c.result = err
	c.cut = w.grace.Err() != nil && errors.Is(err, context.Canceled)
	c.msg = amqp.Publishing{} // the recorder needs none of it
	w.noteHalt(c)
	w.bytes.Add(-j.size)
	select {
	case w.freed <- struct{}{}:
	default:
	}
	w.outcomes.Put(c)
}

// A window is a deadline that async publishes started close together
// share, so that each does not make a context and a timer of its own. Its
// context is cancelled once it is no longer the newest and its last
// publish has ended (or at its deadline).
type window struct {
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time
	refs     atomic.Int64 // its publishes under way, plus one while it is the newest
}

func (win *window) release() {
	if win.refs.Add(-1) == 0 {
		win.cancel()
	}
}

// windowSlack is how much earlier than its own a publish's deadline may be
// when it shares a window; at most a twentieth of the publish timeout.
const windowSlack = 100 * time.Millisecond

// windowFor returns a window whose deadline is at most deadline and not
// much earlier. Publishes start in the order of their deadlines (the
// timeout, or the lease's end, which only grows from claim to claim), so
// the newest window almost always fits.
func (w *worker) windowFor(deadline time.Time) *window {
	slack := min(windowSlack, w.r.cfg.publishTimeout/20)
	if win := w.win; win != nil && !deadline.Before(win.deadline) && deadline.Sub(win.deadline) <= slack {
		return win
	}
	ctx, cancel := context.WithDeadline(w.publishCtx, deadline)
	win := &window{ctx: ctx, cancel: cancel, deadline: deadline}
	win.refs.Store(1)
	if w.win != nil {
		w.win.release()
	}
	w.win = win
	return win
}

// noteHalt remembers a publish that found the publisher closed or without
// a connection, for the worker to stop or wait.
func (w *worker) noteHalt(c *claimed) {
	closed := errors.Is(c.result, publisher.ErrClosed)
	if !closed && !errors.Is(c.result, publisher.ErrNotConnected) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var unreachable *brokerUnreachableError
	switch {
	case closed:
		w.halt = c.result
	case w.halt == nil:
		w.halt = &brokerUnreachableError{rows: 1, cause: c.result}
	case errors.As(w.halt, &unreachable):
		unreachable.rows++
	}
}

// takeHalt returns and forgets what noteHalt remembered.
func (w *worker) takeHalt() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.halt
	w.halt = nil
	return h
}

// claimBatch leases a batch of due rows, holding at most budget bytes of
// messages (the first row always); nil when none is due. It waits for a
// pool connection under ctx, so a stopped relay does not wait on a busy
// pool, and claims under grace: a claim cut short after the database ran it
// would leave its rows leased, unpublished, until the lease ends.
func (r *Relay) claimBatch(ctx, grace context.Context, budget int64) (*batch, error) {
	conn, err := r.o.db.Conn(ctx)
	if err != nil {
		return nil, pgsql.RedactErr(err)
	}
	defer conn.Close()
	token := newToken()
	lease := r.cfg.leaseFor()
	claimedAt := time.Now() // before the claim: the lease ends no earlier than this says
	rows, found, err := r.claim(grace, conn, token, lease, budget)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	for _, c := range rows {
		c.token, c.leaseEnd = token, claimedAt.Add(lease)
	}
	return &batch{rows: rows, found: found}, nil
}

// newToken returns a random claim token.
func newToken() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24)
	return int64(binary.BigEndian.Uint64(b[:]) >> 1)
}

// brokerUnreachableError: publishes found the publisher without a
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

// queryer is a *sql.DB or a *sql.Conn.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// claim leases up to a batch of due rows, in id order, in one statement
// (so one short transaction): it locks the due rows it can (SKIP LOCKED:
// another relay's claim in progress keeps its own), keeps those that fit
// budget bytes (the first always), stamps them with token and the lease's
// end, and returns their messages. found is how many due rows it locked,
// kept or not.
func (r *Relay) claim(ctx context.Context, db queryer, token int64, lease time.Duration, budget int64) (rows []*claimed, found int, err error) {
	qctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	rs, err := db.QueryContext(qctx, r.claimSQL(), r.cfg.batchSize, budget, token, lease.Milliseconds())
	if err != nil {
		return nil, 0, pgsql.RedactErr(err)
	}
	defer rs.Close()
	for rs.Next() {
		c := &claimed{}
		// The properties are decoded (copied) before the next row: the
		// driver's buffer serves, without a copy of its own.
		var props sql.RawBytes
		var body []byte
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

// claimSQL is claim's statement: $1 the batch size, $2 the byte budget, $3
// the token, $4 the lease in milliseconds.
func (r *Relay) claimSQL() string {
	return `WITH due AS (
	SELECT id, octet_length(body) + octet_length(properties) AS size
	FROM ` + r.cfg.table.Quoted + `
	WHERE status = 'in_flight' AND next_retry_at <= now() AND (leased_until IS NULL OR leased_until <= now())
	ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
), fit AS (
	SELECT id FROM (SELECT id, sum(size) OVER (ORDER BY id) AS total, row_number() OVER (ORDER BY id) AS n FROM due) s
	WHERE n = 1 OR total <= $2::bigint
)
UPDATE ` + r.cfg.table.Quoted + ` AS t
SET claim = $3, leased_until = clock_timestamp() + $4::bigint * interval '1 millisecond'
FROM fit WHERE t.id = fit.id
RETURNING t.id, t.message_id, t.exchange, t.routing_key, t.retried_count, t.properties, t.body, (SELECT count(*) FROM due)`
}

func (r *Relay) publishOne(ctx context.Context, c *claimed, timeout time.Duration) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("outbox relay: the publisher panicked: %v", v)
		}
	}()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return r.pub.Publish(pctx, c.exchange, c.key, c.msg)
}

// outcome is what record writes to a row that was not sent: a failed try
// (tries 1, with the reason, due again after delay or failed for good), or
// the claim handed back (tries 0: due at once, nothing else changed). Claim
// is the token the row must still carry.
type outcome struct {
	ID      int64   `json:"id"`
	Claim   int64   `json:"claim"`
	Tries   int     `json:"tries"`
	Reason  *string `json:"reason"`
	Status  Status  `json:"status"`
	DelayMS int64   `json:"delay_ms"`
}

// sentRow is a confirmed row, under the claim it was published with.
type sentRow struct{ id, claim int64 }

// record writes the outcome of each row, under the claim it was published
// with: the confirmed rows sent, failed tries counted, the rest handed back.
// A database that fails is retried until the earliest lease among them ends,
// or keep does: the confirms are known, and losing them would send the rows
// again.
func (r *Relay) record(keep context.Context, rows []*claimed) {
	var sent []sentRow
	var outcomes []outcome
	leaseEnd := rows[0].leaseEnd
	release := func(c *claimed) {
		outcomes = append(outcomes, outcome{ID: c.id, Claim: c.token, Status: StatusInFlight})
	}
	for _, c := range rows {
		if c.leaseEnd.Before(leaseEnd) {
			leaseEnd = c.leaseEnd
		}
		switch {
		case c.bad != nil:
			outcomes = append(outcomes, r.failure(c, c.bad, true))
		case !c.attempted:
			release(c)
		case c.result == nil:
			sent = append(sent, sentRow{c.id, c.token})
		case c.cut, c.unsent, errors.Is(c.result, publisher.ErrClosed), errors.Is(c.result, publisher.ErrNotConnected):
			// The shutdown timeout cut the wait for the confirm, the
			// publish gave up before sending, or the publisher was closed
			// or without a connection: not the message's fault, so not a
			// try.
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
		err := r.write(keep, &sent, outcomes)
		if err == nil {
			break
		}
		if outages == 0 {
			outageStart = time.Now()
		}
		outages++
		wait := backoff(outages, outageBackoffInitial, outageBackoffMax)
		if keep.Err() != nil || time.Now().Add(wait).After(leaseEnd) {
			r.cfg.logger.Warn("outbox relay: cannot reach the outbox table to record published rows; they stay claimed until the lease ends, then are sent again (consumers deduplicate on MessageId)",
				"table", r.cfg.table.Name, "rows", len(rows), "confirmed", len(sent), "error", pgsql.Redact(err.Error()))
			return
		}
		r.cfg.logger.Warn("outbox relay: cannot reach the outbox table to record published rows; retrying within the lease",
			"table", r.cfg.table.Name, "rows", len(rows), "error", pgsql.Redact(err.Error()), "retry_in", wait, "failures", outages)
		if !sleep(keep, wait) {
			return
		}
	}
	if outages > 0 {
		r.cfg.logger.Info("outbox relay: the outage is over; recorded the published rows and resumed", "table", r.cfg.table.Name, "after", since(outageStart), "failures", outages)
	}
}

// write runs record's statements, each alone (so in a short transaction of
// its own), the confirmed rows first; once those are written it empties
// *sent, so that a retry does not repeat them.
func (r *Relay) write(keep context.Context, sent *[]sentRow, outcomes []outcome) error {
	ctx, cancel := context.WithTimeout(keep, dbTimeout)
	defer cancel()
	if len(*sent) > 0 {
		// The ids and claims go as two array literals, which every driver
		// passes as text.
		var ids, claims strings.Builder
		ids.WriteByte('{')
		claims.WriteByte('{')
		for i, s := range *sent {
			if i > 0 {
				ids.WriteByte(',')
				claims.WriteByte(',')
			}
			ids.WriteString(strconv.FormatInt(s.id, 10))
			claims.WriteString(strconv.FormatInt(s.claim, 10))
		}
		ids.WriteByte('}')
		claims.WriteByte('}')
		res, err := r.o.db.ExecContext(ctx, `UPDATE `+r.cfg.table.Quoted+` AS t
		SET status = 'sent', sent_at = clock_timestamp(), last_error = NULL, claim = NULL, leased_until = NULL
		FROM unnest($1::bigint[], $2::bigint[]) AS s(id, claim)
		WHERE t.id = s.id AND t.claim = s.claim AND t.status = 'in_flight'`, ids.String(), claims.String())
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
		    next_retry_at = CASE WHEN o.tries > 0 THEN clock_timestamp() + o.delay_ms * interval '1 millisecond' ELSE t.next_retry_at END,
		    claim = NULL, leased_until = NULL
		FROM jsonb_to_recordset($1::jsonb) AS o(id bigint, claim bigint, tries integer, reason text, status text, delay_ms bigint)
		WHERE t.id = o.id AND t.claim = o.claim AND t.status = 'in_flight'`, string(data))
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
	return outcome{ID: c.id, Claim: c.token, Tries: 1, Reason: &reason, Status: status, DelayMS: delay.Milliseconds()}
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

// sleepUnless waits d or until done is closed; false means done was closed.
func sleepUnless(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
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

package listener

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/errtext"
	"github.com/amqpretry/amqpretry/internal/telemetry"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// Listener consumes one queue with a pool of consumers, runs every delivery
// through a middleware chain and settles it. Create it with New and start it
// with Run.
type Listener struct {
	queue    string
	mw       middleware.Middleware
	handler  middleware.Handler
	batch    *batchConfig // NewBatch's; nil for New
	cfg      config
	redacted string
	tel      *telemetry.Telemetry
	spanName string
	attrs    spanAttrs

	// killSwitch is nil without WithKillSwitch.
	killSwitch *killSwitch

	// overLimit handles deliveries past WithRedeliveryLimit: the chain's
	// recoverer, without the chain. Nil without the option.
	overLimit    middleware.Handler
	hasRecoverer bool

	running atomic.Bool
	stats   counters
	// countsToldOnce: the log has said that the queue counts deliveries.
	countsToldOnce atomic.Bool
	deadLetters    *deadLetterLog // what of the dead letters is logged (deadletterlog.go)
	failures       *deadLetterLog // ... and of the messages that failed and went back to the broker
	// guarded: its connections read through framecheck's guard, since a
	// message's headers could not be parsed (unreadable.go).
	guarded atomic.Bool
	// uncountedToldOnce: the log has said that the queue does not, so that
	// WithRedeliveryLimit cannot act.
	uncountedToldOnce atomic.Bool
	// singleActive: whether the queue delivers to one consumer at a time
	// (singleactive.go); singleActiveTold: the log has said so.
	singleActive     atomic.Int32
	singleActiveTold atomic.Bool
	// parallel: two of its consumers have had messages at once, which a
	// single-active queue never allows (seeParallel).
	parallel atomic.Bool

	// pool is the handler slots shared by its channels (pool.go).
	pool *workers

	mu        sync.Mutex
	consumers map[*consumer]struct{} // active, for Stats

	ready *readiness
}

// New checks its arguments and options and returns a Listener for queue;
// it does not connect (Run does). mw may be nil for no middleware.
//
// It refuses a chain whose retries could hold a delivery in memory longer
// than the broker's consumer_timeout (WithConsumerTimeout): such delays belong
// in broker-side retry tiers (package dlx).
func New(queue string, mw middleware.Middleware, h middleware.Handler, opts ...Option) (*Listener, error) {
	return newListener("New", queue, mw, h, nil, opts)
}

// newListener is New and NewBatch (batch non-nil; h then stands in for the
// handler of a failed message's chain, which each consumer builds). who
// names the constructor in errors.
func newListener(who, queue string, mw middleware.Middleware, h middleware.Handler, batch *batchConfig, opts []Option) (*Listener, error) {
	cfg := defaultConfig()
	for _, opt := range opts {
		opt(&cfg)
	}
	if !cfg.maxSet {
		cfg.max = cfg.min
	}
	if !cfg.prefetchSet {
		cfg.prefetch = defaultPrefetch(cfg.max, batch, cfg.coalesceAcks)
	}
	if queue == "" {
		cfg.fail("%s expects a queue name, got \"\"", who)
	}
	if h == nil {
		cfg.fail("%s expects a non-nil handler", who)
	}
	if batch != nil {
		batch.check(&cfg)
	}
	if cfg.max < cfg.min {
		cfg.fail("WithMaxConcurrentConsumers expects at least the concurrent consumers (%d), got %d", cfg.min, cfg.max)
	}
	if cfg.coalesceAcks > cfg.prefetch && cfg.prefetch > 0 {
		cfg.fail("WithAckCoalescing expects at most the prefetch (%d) deliveries, got %d: a consumer whose prefetch is full of "+
			"deliveries waiting for their ack receives no more until the delay passes; a quarter of the prefetch keeps them flowing", cfg.prefetch, cfg.coalesceAcks)
	}
	if cfg.max > MaxConsumers {
		cfg.fail("WithMaxConcurrentConsumers expects at most %d (each consumer is a channel; RabbitMQ allows 2047 per connection), got %d", MaxConsumers, cfg.max)
	}
	cfg.checkConnection()
	cfg.checkConsumer()
	cfg.consumeArgs = cfg.consumer.arguments(cfg.consumerTimeoutArg.Milliseconds())
	if mw == nil {
		mw = middleware.Chain()
	}
	// Building the chain tells how long its Retries may wait and which
	// recoverer it ends in, without running any of it. (Each consumer
	// builds its own around its gate.)
	var survey chainctx.Survey
	if h != nil {
		survey = chainctx.SurveyChain(func() { mw(h) })
		wait, what := survey.Wait, "their waits, and the handler's Timeouts on every attempt"
		if batch != nil {
			wait += batch.wait // a delivery may wait that long for its batch to fill
			what += ", and the batch's wait"
		}
		if wait < cfg.consumerTimeout && wait+cfg.coalesceDelay >= cfg.consumerTimeout {
			cfg.fail("the middleware's retries may hold a delivery for %v (%s) and WithAckCoalescing may hold its ack %v more, "+
				"together longer than the consumer timeout %v: the broker would close the channel and redeliver it. "+
				"Use a shorter delay, fewer or shorter local retries, or raise consumer_timeout and WithConsumerTimeout together",
				wait, what, cfg.coalesceDelay, cfg.consumerTimeout)
		} else if wait >= cfg.consumerTimeout {
			cfg.fail("the middleware's retries may hold a delivery for %v (%s), "+
				"longer than the consumer timeout %v: the broker would close the channel and redeliver it. Use fewer or shorter "+
				"local retries or a shorter middleware.Timeout, hand longer delays to broker-side retry tiers (package dlx), "+
				"or raise consumer_timeout and WithConsumerTimeout together",
				wait, what, cfg.consumerTimeout)
		}
		// A failed delivery then waits for its requeue, unsettled too.
		if hold := wait + cfg.requeueDelayMax; cfg.requeueDelay > 0 && hold >= cfg.consumerTimeout && wait < cfg.consumerTimeout {
			if cfg.requeueDelaySet {
				cfg.fail("WithRequeueDelay's max %v, after the middleware's retries (%v), may hold a failed delivery unsettled for %v, "+
					"as long as the consumer timeout %v or longer: the broker would take it back uncounted at the timeout (RabbitMQ 4.3 "+
					"cancels the consumer), and a message that always fails would never reach its delivery limit. Use a max below %v",
					cfg.requeueDelayMax, wait, hold, cfg.consumerTimeout, (cfg.consumerTimeout-wait)/2)
			} else {
				cfg.requeueDelayMax = (cfg.consumerTimeout - wait) / 2
				cfg.requeueDelay = min(cfg.requeueDelay, cfg.requeueDelayMax)
			}
		}
		if r, ok := survey.Recoverer.(interface{ RedeliversThroughBroker() bool }); ok && cfg.redeliveryLimit > 0 && r.RedeliversThroughBroker() {
			cfg.fail("WithRedeliveryLimit(%d) counts every delivery of the queue (x-delivery-count), and the chain's recoverer (dlx's Redeliver, "+
				"for a Topology with DelayedRedelivery) hands each failure back to the broker, which counts it too: the limit would cut the "+
				"broker's redeliveries short and dead-letter a failing message as one that crashes the process. Leave WithRedeliveryLimit out: "+
				"the topology's x-delivery-limit already bounds a message that crashes the process, and the last delivery dead-letters a "+
				"failing one with the handler's error", cfg.redeliveryLimit)
		}
		if survey.Retries && survey.Recoverer == nil && cfg.redeliveryLimit == 0 {
			cfg.fail("the middleware has a Retry but no Recover: a message that exhausts its retries would go back to the queue " +
				"and fail again, for ever. End the chain with Recover(recoverer.Republish(pub, dlx, key)) (a dead-letter queue: " +
				"dlx.Topology declares one), or set WithRedeliveryLimit(n) on a quorum queue (past n deliveries the message is rejected " +
				"to the queue's dead-letter exchange), or, to requeue it for ever on purpose, Recover(recoverer.Requeue())")
		}
		if d := survey.TimeoutAroundRecover; d > 0 {
			cfg.fail("the middleware has Timeout(%v) around Recover: once its deadline passes the recoverer cannot run (its context has ended), "+
				"so the delivery would be requeued and run again for ever. Put Timeout innermost, next to the handler: "+
				"Chain(Retry(n), Recover(r), Timeout(%v)); to bound every attempt together, put the Timeout inside the Recover or use Retry's WithMaxElapsedTime", d, d)
		}
	}
	if len(cfg.errs) > 0 {
		return nil, errors.Join(cfg.errs...)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	l := &Listener{
		queue: queue, mw: mw, handler: h, batch: batch, cfg: cfg,
		redacted:  cfg.conn.Redacted(),
		consumers: map[*consumer]struct{}{},
		pool:      newWorkers(cfg.min, cfg.max),
		ready:     newReadiness(),
		tel:       telemetry.New(cfg.telemetry),
		spanName:  "process " + queue,
	}
	l.attrs = newSpanAttrs(l.tel, queue)
	l.deadLetters, l.failures = newLogs(cfg.deadLetterBurst, cfg.deadLetterEvery)
	if cfg.redeliveryLimit > 0 {
		l.overLimit, l.hasRecoverer = overLimitHandler(survey.Recoverer, cfg.redeliveryLimit)
	}
	if cfg.killSwitch != nil {
		l.killSwitch = newKillSwitch(*cfg.killSwitch)
	}
	return l, nil
}

// Run connects, consumes and settles until ctx is done, then shuts down
// gracefully and returns nil: it stops consuming, requeues deliveries waiting
// between retries at once, gives running handlers the shutdown timeout to
// finish, then cancels their context, requeues what is left and closes. Every
// goroutine it started has ended when it returns.
//
// Connection losses are retried with backoff and logged. Run returns an error
// only for what retrying cannot fix: a refused login, a declaration the
// broker or the declaring code refuses (see WithDeclare), a basic.consume
// the broker refuses (*ConsumeRefusedError: a consumer argument the queue's
// type does not take, no read permission, an exclusive consumer elsewhere),
// a missing queue with WithMissingQueueFatal.
func (l *Listener) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	sv := newSupervisor(l, ctx)
	defer sv.cancelHandlers()

	if !l.cfg.urlSet {
		l.cfg.logger.Warn("listener: no WithURL or WithURLs: consuming from the default broker", "queue", l.queue, "url", l.redacted)
	}
	err := sv.loop(ctx)
	sv.shutdown()
	sv.closers.Wait() // every connection is abandoned by now: their closes have ended
	var fatal *fatalError
	if errors.As(err, &fatal) {
		err = fatal.err
	}
	l.ready.stop(err)
	l.logSummariesDue(true)
	if ctx.Err() != nil {
		sv.draining() // (if it ended between connections)
		st := l.Stats()
		l.cfg.logger.Info("listener: stopped", "queue", l.queue, "handled", st.Handled-sv.drain.handled,
			"handed_back", st.Requeued-sv.drain.requeued, "took", time.Since(sv.drain.began).Round(time.Millisecond))
	}
	return err
}

// draining marks the start of a graceful shutdown, once: readiness goes
// false at once (a probe must stop routing to a listener that is stopping,
// not wait for its handlers), and the log says so.
func (sv *supervisor) draining() {
	if !sv.drain.began.IsZero() {
		return
	}
	l := sv.l
	st := l.Stats()
	sv.drain.began, sv.drain.handled, sv.drain.requeued = time.Now(), st.Handled, st.Requeued
	l.ready.consuming(false)
	l.cfg.logger.Info("listener: draining: consuming stops, handlers running may finish within the shutdown timeout",
		"queue", l.queue, "in_flight", st.InFlight, "running", st.Running, "shutdown_timeout", l.cfg.shutdownTimeout)
}

// newSupervisor prepares one run of l until ctx is done.
func newSupervisor(l *Listener, ctx context.Context) *supervisor {
	sv := &supervisor{l: l, ctx: ctx, interrupt: make(chan struct{})}
	// Handlers outlive ctx by up to the shutdown timeout: they get a context
	// that keeps ctx's values but is cancelled separately.
	sv.handlerCtx, sv.cancelHandlers = context.WithCancel(context.WithoutCancel(ctx))
	return sv
}

// supervisor owns one call to Run: it dials and redials, serves each
// connection, and at shutdown interrupts waits and waits in turn for every
// goroutine it started.
type supervisor struct {
	l              *Listener
	ctx            context.Context // Run's: done means shut down
	handlerCtx     context.Context
	cancelHandlers context.CancelFunc
	interrupt      chan struct{} // closed at shutdown: ends retry waits and requeue delays
	interruptOnce  sync.Once
	consumers      sync.WaitGroup // every consumer goroutine, old connections' included
	consumed       bool           // the current connection has started a consumer (loop's and serve's goroutine only)
	lostAt         time.Time      // when a connection that had started consumers was lost (serve's goroutine only)
	closers        sync.WaitGroup // channel and connection closes still waiting for the broker (closeBounded)
	settingUp      atomic.Bool    // serve is opening a consumer: waiting for the broker (boundSetupAtShutdown)
	// drain is when a graceful shutdown began and the counts then (Run's
	// and serve's goroutine, one after the other).
	drain struct {
		began             time.Time
		handled, requeued uint64
	}
}

// closeWait bounds how long a shutdown waits for the broker's close-ok to a
// channel's or the connection's close: on a connection that has frozen
// (a host that stopped answering, nothing reset) it never comes, and amqp091
// would wait until the heartbeat gives up. A broker that answers does so in
// milliseconds.
const closeWait = 500 * time.Millisecond

// closeBounded runs closeFn, a Close that waits for the broker's reply, for
// at most closeWait. One that takes longer goes on in the background until
// the connection is abandoned, which ends it; Run waits for it then.
func (sv *supervisor) closeBounded(closeFn func() error) {
	done := make(chan struct{})
	sv.closers.Add(1)
	go func() {
		defer sv.closers.Done()
		defer close(done)
		_ = closeFn()
	}()
	timer := time.NewTimer(closeWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	}
}

func (sv *supervisor) loop(ctx context.Context) error {
	l := sv.l
	return connectionLoop{
		cfg: &l.cfg, who: "listener", attrs: []any{"queue", l.queue},
		serve: func(conn *amqpconn.Conn) (bool, error) {
			l.ready.connected()
			sv.consumed = false
			err := sv.serve(ctx, conn)
			return sv.consumed, err
		},
		lost:     l.ready.lost,
		guarding: func() { l.guarded.Store(true) },
	}.run(ctx, ctx)
}

// interruptAll ends every wait of every consumer: shutdown.
func (sv *supervisor) interruptAll() {
	sv.interruptOnce.Do(func() { close(sv.interrupt) })
	sv.l.mu.Lock()
	defer sv.l.mu.Unlock()
	for c := range sv.l.consumers {
		c.interruptWaits()
	}
}

// shutdown ends every consumer: waits are interrupted at once, running
// handlers get the shutdown timeout, then their context is cancelled.
func (sv *supervisor) shutdown() {
	sv.interruptAll()
	done := make(chan struct{})
	go func() { sv.consumers.Wait(); close(done) }()
	timer := time.NewTimer(sv.l.cfg.shutdownTimeout)
	defer timer.Stop()
	select {
	case <-done:
		return
	case <-timer.C:
	}
	sv.l.cfg.logger.Warn("listener: handlers still running after the shutdown timeout; cancelling their context", "queue", sv.l.queue, "timeout", sv.l.cfg.shutdownTimeout)
	sv.cancelHandlers()
	for {
		select {
		case <-done:
			return
		case <-time.After(5 * time.Second):
			sv.l.cfg.logger.Error("listener: a handler ignores its cancelled context; Run waits for it", "queue", sv.l.queue, "in_flight", sv.l.Stats().InFlight)
		}
	}
}

// dial connects; a refused login or certificate, which redialing cannot
// change, is fatal. who prefixes the errors.
func dial(ctx context.Context, dialer *amqpconn.Dialer, who string) (*amqpconn.Conn, error) {
	conn, err := dialer.Dial(ctx)
	if err != nil {
		if url, refusal := amqpconn.LoginRefused(err); refusal != nil {
			return nil, &fatalError{&LoginRefusedError{Who: who, URL: url, Err: refusal}}
		}
		if url, cause := amqpconn.TLSRefused(err); cause != nil {
			return nil, &fatalError{fmt.Errorf("%s: the broker's certificate at %s cannot be verified (give WithTLS the CA that signed it, "+
				"and a URL with the host name the certificate is for): %w", who, url, cause)}
		}
		return nil, fmt.Errorf("%s: dial %w", who, err) // err names each address
	}
	return conn, nil
}

// fatalError ends Run instead of being retried.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

func (e *fatalError) Unwrap() error { return e.err }

func isFatal(err error) bool {
	var f *fatalError
	return errors.As(err, &f)
}

// recovered counts a delivery its recoverer put elsewhere, and says so for
// a dead letter: an operator should not learn of failures only by listing
// the DLQ.
func (l *Listener) recovered(messageID string, r *recovery) {
	l.stats.recovered.Add(1)
	if !r.deadLetter {
		return
	}
	l.stats.deadLettered.Add(1)
	l.tel.DeadLettered.Add(context.Background(), 1, l.attrs.queue.Add...)
	full, summary := l.deadLetters.take(time.Now(), chainrun.ErrorType(r.failedFor))
	l.logSummary(l.deadLetters, summary)
	if !full {
		return
	}
	to := r.to
	if !r.told {
		to = "(not said by the recoverer: it can name the place with middleware.DeadLettered)"
	}
	l.cfg.logger.Warn("listener: message dead-lettered", "queue", l.queue, "message_id", messageID, "to", to,
		"attempts", r.attempts, "error_type", chainrun.ErrorType(r.failedFor), "error", errtext.String(chainrun.HandlerError(r.failedFor)))
}

// Queue is the queue the listener consumes.
func (l *Listener) Queue() string { return l.queue }

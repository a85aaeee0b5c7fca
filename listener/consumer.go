package listener

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/errtext"
	"github.com/amqpretry/amqpretry/internal/telemetry"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// consumer is one channel with its own prefetch and basic.consume. It runs one
// handler at a time: the gate around the handler is held while the handler
// runs and free while a delivery waits between retries.
type consumer struct {
	sv         *supervisor
	ch         *amqp.Channel
	tag        string
	deliveries <-chan amqp.Delivery
	ended      chan<- *consumer
	pending    sync.WaitGroup  // deliveries in flight, on any goroutine
	ctx        context.Context // for its deliveries: cancelled when the channel dies or handlers time out
	cancel     context.CancelFunc
	handle     middleware.Handler // mw(gate(CatchPanics(h))); in batch mode, the chain of a failed delivery (batch.go)
	b          *batchConsumer     // batch mode's state (batch.go); nil for a Handler
	acks       *settler           // settles its deliveries on ch (coalesce.go)
	gate       chan struct{}
	spans      spanBuffers // for startProcess, used by the current reader only

	consuming       atomic.Bool
	stopping        atomic.Bool // the listener cancelled it: requeue what still arrives
	holding         atomic.Bool // ... on an ordered queue: hold what still arrives for the channel's close to hand back (stopOrdered)
	brokerCancelled atomic.Bool // the broker sent basic.cancel

	// careful: a consumer at prefetch 1 while returned messages come back
	// (redelivery.go); it tells calm when a fresh one arrives.
	careful  bool
	calm     chan<- struct{}
	handOver atomic.Bool // stopped as careful ends: handle what still arrives, do not nack it
	prefetch int

	// interrupt ends the waits of its deliveries and keeps them from their
	// recoverer: closed at shutdown, or when the kill switch trips.
	interrupt     chan struct{}
	interruptOnce sync.Once
	forget        func()        // drops the channel's broker version (amqpconn.Remember)
	finished      chan struct{} // closed when finish is done with the channel

	current        atomic.Pointer[delivery] // the one the reader is handling
	parked         parkedList               // those waiting between attempts, oldest first
	prefetchWarned bool                     // watchAges's: the prefetch warning was given

	inFlight, waiting atomic.Int64
	running           atomic.Int64 // deliveries in the running call: 1, or a batch's
	busyNanos         atomic.Int64 // handler time of finished calls
	// busySince is the monotime when the running call started, 0 when none
	// runs.
	busySince  atomic.Int64
	calls      atomic.Uint64
	lastActive atomic.Int64 // monotime of the last finished call

	// the scaler's previous sample
	sampledBusy  int64
	sampledCalls uint64
}

// monotime is nanoseconds on the monotonic clock: one clock read where
// time.Now makes two, and it runs several times per message.
func monotime() int64 { return telemetry.Mono() }

// startConsumer opens a channel, sets its prefetch and starts consuming.
// ended receives the consumer once, when it stops without being asked to
// (broker cancel, channel closed), so that serve can replace it.
//
// With calm non-nil it is a careful consumer: prefetch 1, and a signal on calm
// when a message arrives that was never delivered before.
//
// prefetch 0 means the configured one.
func (sv *supervisor) startConsumer(conn *amqp.Connection, ended chan<- *consumer, calm chan<- struct{}, prefetch int) (*consumer, error) {
	l := sv.l
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	// A recoverer handed one of its deliveries may ask which broker it came
	// from (dlx's Redeliver on a broker older than 4.3).
	forget := amqpconn.Remember(ch, amqpconn.VersionOf(conn.Properties))
	if prefetch == 0 {
		prefetch = l.cfg.prefetch
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		_ = ch.Close()
		forget()
		return nil, err
	}
	tag := l.cfg.consumer.nextTag()
	deliveries, err := ch.Consume(l.queue, tag, false, l.cfg.consumer.exclusive, false, false, l.cfg.consumeArgs)
	if err != nil {
		_ = ch.Close()
		forget()
		return nil, err
	}
	ctx, cancel := context.WithCancel(sv.handlerCtx)
	c := &consumer{
		sv: sv, ch: ch, tag: tag, cancel: cancel,
		acks:    l.newSettler(ch, cmp.Or(prefetch, l.cfg.prefetch), tag),
		gate:    make(chan struct{}, 1),
		careful: calm != nil, calm: calm, prefetch: prefetch,
		interrupt: make(chan struct{}),
		forget:    forget,
		finished:  make(chan struct{}),
	}
	select {
	case <-sv.interrupt:
		c.interruptWaits()
	default:
	}
	c.ctx = sv.chainContext(ctx, c.interrupt)
	if l.batch != nil {
		c.b = newBatchConsumer(c)
	} else {
		c.handle = l.mw(c.gated(middleware.CatchPanics()(l.handler)))
	}
	c.consuming.Store(true)
	c.lastActive.Store(monotime())
	l.mu.Lock()
	l.consumers[c] = struct{}{}
	l.mu.Unlock()
	l.tel.ActiveConsumers.Add(ctx, 1, l.attrs.queue.Add...)

	c.deliveries, c.ended = deliveries, ended
	c.acks.start(&sv.consumers)
	// When the channel dies, its deliveries can no longer be settled (the
	// broker has requeued them): cancel their handlers and waits at once,
	// not when the reader next looks, so none of them reaches a recoverer.
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	// The broker cancels a consumer when its queue is deleted, and, on
	// RabbitMQ 4.3 quorum queues, when a delivery outlives the consumer
	// timeout: then it returns the consumer's unacked deliveries to the
	// queue, uncounted, and keeps the channel open. Their handlers are
	// working on messages another consumer will get: cancel them too.
	cancels := ch.NotifyCancel(make(chan string, 1))
	sv.consumers.Add(1)
	go func() {
		defer sv.consumers.Done()
		select {
		case err := <-closes:
			if IsConsumerTimeout(err) {
				l.tellConsumerTimeout(c, err)
			}
		case <-cancels:
			// From the cancel itself nothing more is settled on this
			// channel (settle and admit look at brokerCancelled): the queue
			// is gone, or (RabbitMQ 4.3's consumer timeout) the broker has
			// taken the deliveries back and gives them to another consumer,
			// and a late ack there would settle messages it returned, or
			// copies another consumer holds. Finding out which takes a round
			// trip, and deliveries still in the client's buffer would be
			// admitted and settled meanwhile.
			c.brokerCancelled.Store(true)
			c.acks.abandon() // the acks that wait are not written
			cancel()
			if l.queueExists(conn) {
				l.tellConsumerCancelled(c)
			} else {
				l.cfg.logger.Warn("listener: the broker cancelled a consumer (queue deleted?)", "queue", l.queue, "consumer", c.tag)
			}
		case <-c.finished:
			// finish closed the channel, or gave up waiting for the
			// broker's close-ok on a frozen connection
		}
		cancel()
	}()
	c.spawnReader()
	return c, nil
}

// stop cancels consumption; deliveries in flight finish and settle, and the
// channel closes after them. It does not wait for the broker's cancel-ok, so
// a dead connection cannot stall a shutdown; deliveries the broker sends
// meanwhile stay unacked and are requeued when the channel closes.
//
// On an ordered queue it stops with stopOrdered instead.
func (c *consumer) stop() {
	if c.sv.l.ordered() {
		c.stopOrdered()
		return
	}
	if c.stopping.CompareAndSwap(false, true) {
		if err := c.ch.Cancel(c.tag, true); err != nil {
			c.cancel() // the channel is gone: nothing can be settled any more
		}
	}
}

// ordered reports whether the queue hands its messages to one consumer at a
// time, in order: single active consumer (declared or observed), or an
// exclusive consumer (WithExclusive), whose successor waits to subscribe.
func (l *Listener) ordered() bool {
	return l.cfg.consumer.exclusive || l.singleActiveHolds()
}

// stopOrdered stops a consumer of an ordered queue without a basic.cancel,
// which would make the next consumer (the standby of single active
// consumer, an exclusive one waiting) active at once, while this one still
// runs a handler and holds the messages it prefetched: the next would handle
// later messages first, and side by side with this one. Instead the
// consumer starts no new handler (what still arrives is held), lets the
// deliveries in flight finish and settle (their waits end, and the shutdown
// timeout bounds them), writes the acks that wait, and then closes its
// channel: the broker gives the held messages back to the queue, in order,
// and activates the next consumer in the same step.
func (c *consumer) stopOrdered() {
	if !c.holding.CompareAndSwap(false, true) {
		return
	}
	c.stopping.Store(true)
	c.sv.consumers.Add(1)
	go func() {
		defer c.sv.consumers.Done()
		// admit counts a delivery in flight before it looks at stopping:
		// once stopping is set, a count of zero stays zero.
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for c.inFlight.Load() > 0 {
			select {
			case <-tick.C:
			case <-c.finished: // the channel died meanwhile
				return
			}
		}
		c.acks.close(!c.ch.IsClosed() && !c.brokerCancelled.Load())
		c.sv.closeBounded(c.ch.Close) // the reader finishes as the deliveries channel closes
	}()
}

// chainContext is what the chain of every delivery sees: the queue, the
// shutdown signal that ends its waits, the logger, and the listener's telemetry, which
// the chain's Retry and Recover use unless given providers of their own.
func (sv *supervisor) chainContext(ctx context.Context, interrupt <-chan struct{}) context.Context {
	l := sv.l
	ctx = chainctx.WithLogger(chainctx.WithQueue(chainctx.WithInterrupt(ctx, interrupt), l.queue), l.cfg.logger)
	return telemetry.With(ctx, l.tel)
}

// A consumer's deliveries are handled on the goroutine that reads them, so
// a healthy message costs no goroutine of its own. When a delivery is about
// to wait (chainrun.WillWait: a backoff, a recoverer's publish, a requeue
// delay), it is parked: its goroutine hands the reading over to a new one
// and stays with the delivery. Exactly one goroutine reads at a time.

// delivery is one message in flight. It is also the context its chain runs
// in (the process span's context plus itself as the chain's wait hook),
// which saves an allocation per message. It is allocated for every message,
// so what only some need (a place in the parked list, a recovery) hangs off
// it, allocated when needed: 384 bytes rather than 448.
type delivery struct {
	context.Context
	amqp.Delivery
	c *consumer

	// For the consumer-timeout watch (age.go): copies that the chain cannot
	// change under it, and its place among the parked deliveries.
	received int64 // monotime when it was read
	id       string
	tag      uint64
	link     *parkLink // in the parked list, under its lock; nil until it parks

	fate *recovery // nil until its chain hands it to the recoverer, or it comes in a batch

	reader     atomic.Bool  // its goroutine is still the consumer's reader
	place      atomic.Int32 // unlisted, listed, settled
	agedWarned atomic.Bool
}

// parkLink is a parked delivery's place in its consumer's parked list.
type parkLink struct{ prev, next *delivery }

// recovery is what a delivery whose chain went to the recoverer carries,
// set and read on the delivery's goroutine.
type recovery struct {
	failedFor   error // the cause it went to the recoverer with (Recovering), for the kill switch
	recorded    bool  // the kill switch has counted it already
	probeFailed bool  // ... as the failure of its probe: it is settled as the chain says

	recovered  bool   // its recoverer put it elsewhere (RecoveredTo): acked, it counts as recovered
	told       bool   // ... and said where (to, deadLetter)
	to         string // where its recoverer put it, for the log
	attempts   int    // ... after so many failed attempts
	deadLetter bool   // ... as a dead letter, not a retry hop

	// batch mode: the batch it came in and its place there (batch.go)
	batch *batchRun
	index int
}

// inBatch returns the batch dd came in, nil for a delivery of New's.
func (dd *delivery) inBatch() *batchRun {
	if dd.fate == nil {
		return nil
	}
	return dd.fate.batch
}

// recovery returns dd's recovery record, making it on first use.
func (dd *delivery) recovery() *recovery {
	if dd.fate == nil {
		dd.fate = &recovery{}
	}
	return dd.fate
}

// RecoveredTo notes where the chain's recoverer put dd: a recoverer that
// says so (Republish, the tiers, middleware.DeadLettered) names the place;
// Recover's own note after every recovery (to "") marks it recovered and
// keeps what the recoverer said.
func (dd *delivery) RecoveredTo(to string, attempts int, deadLetter bool) {
	r := dd.recovery()
	r.recovered = true
	if attempts > 0 && (r.attempts == 0 || to != "") {
		r.attempts = attempts
	}
	switch {
	case to != "":
		r.to, r.deadLetter, r.told = to, deadLetter, true
	case !r.told:
		r.deadLetter = deadLetter
	}
}

func (dd *delivery) Value(key any) any {
	if key == chainctx.WaitHookKey || key == chainctx.RecoveryHookKey {
		return dd
	}
	return dd.Context.Value(key)
}

// Recovering notes that the chain is about to hand dd to its recoverer: a
// failure for the kill switch, though a recovered delivery is acked. It is
// counted now, before the recoverer runs, so that the failure that trips the
// switch, and every one after it, goes back to the queue instead.
func (dd *delivery) Recovering(cause error) error {
	dd.recovery().failedFor = cause
	return dd.c.sv.l.recordFailure(dd, cause)
}

// interruptWaits closes the consumer's interrupt, once.
func (c *consumer) interruptWaits() {
	c.interruptOnce.Do(func() { close(c.interrupt) })
}

// WillWait parks the delivery: it hands the reading of deliveries to a new
// goroutine, once.
func (dd *delivery) WillWait() {
	if dd.reader.CompareAndSwap(true, false) {
		dd.c.parked.park(dd)
		// Parked, it is no longer the reader's current one (the parked
		// list has it for the age watch): a careful start that waits for
		// the consumer to be idle must not wait for its retries.
		dd.c.current.CompareAndSwap(dd, nil)
		dd.handOff()
	}
}

// handOff starts the goroutine that reads in place of dd's, which stays
// with dd: in batch mode it first runs the chains of the rest of dd's
// batch's failures.
func (dd *delivery) handOff() {
	if run := dd.inBatch(); run != nil {
		dd.c.spawnBatchReader(run)
		return
	}
	dd.c.spawnReader()
}

func (c *consumer) spawnReader() {
	if c.b != nil {
		c.spawnBatchReader(nil)
		return
	}
	c.sv.consumers.Add(1)
	go c.read()
}

func (c *consumer) read() {
	defer c.sv.consumers.Done()
	for d := range c.deliveries {
		dd := c.admit(&d)
		if dd == nil {
			continue
		}
		dd.reader.Store(true)
		c.current.Store(dd)
		c.process(dd)
		c.current.CompareAndSwap(dd, nil) // unless another reader has a newer one
		if !dd.reader.CompareAndSwap(true, false) {
			return // it parked: another goroutine reads now
		}
		// Done with dd: a late WillWait on it (from a goroutine its handler
		// left behind) finds reader false and starts no second reader.
	}
	c.finish()
}

// admit takes in a delivery just read: it returns it in flight, or nil for
// one that is not to be handled (nacked here, or left to the broker).
func (c *consumer) admit(d *amqp.Delivery) *delivery {
	if c.brokerCancelled.Load() {
		// The broker has taken back every unacked delivery of this
		// consumer (a 4.3 consumer timeout, or its queue is gone) and
		// gives them to another: handling them here would do the work
		// twice, and settling them is worse than useless (on RabbitMQ
		// 4.3.6 a late nack or reject here could make another of them
		// count as a failed delivery).
		return nil
	}
	if c.sv.l.unreadable(d) {
		c.rejectUnreadable(d)
		return nil
	}
	c.inFlight.Add(1) // before stopping is read: see stopOrdered
	if c.holding.Load() {
		// Stopping on an ordered queue: held unsettled, for the channel's
		// close to hand back in order (a nack would have the broker send it
		// straight back to this consumer, still the active one).
		c.inFlight.Add(-1)
		return nil
	}
	if c.stopping.Load() && !c.handOver.Load() {
		c.inFlight.Add(-1)
		// Arrived after we cancelled: back to the queue at once, with a
		// nack, which does not count as a failed delivery. (A careful
		// consumer handing over handles it instead: before RabbitMQ 4.3
		// a nack counts toward x-delivery-count, and this may be a
		// returned message on its way to the redelivery limit.)
		_ = d.Nack(false, true)
		return nil
	}
	if c.careful && !d.Redelivered {
		select {
		case c.calm <- struct{}{}:
		default: // told already
		}
	}
	if d.Headers != nil && !c.sv.l.countsToldOnce.Load() {
		c.sv.l.tellDeliveryCounting(d.Headers)
	}
	c.pending.Add(1)
	c.acks.received(d.DeliveryTag)
	return &delivery{Delivery: *d, c: c, received: monotime(), id: d.MessageId, tag: d.DeliveryTag}
}

// finish runs once the deliveries channel has closed: it waits for the
// deliveries still in flight, then closes the channel.
func (c *consumer) finish() {
	c.consuming.Store(false)
	l := c.sv.l
	if !c.stopping.Load() {
		if c.ch.IsClosed() && !c.brokerCancelled.Load() {
			l.cfg.logger.Warn("listener: consumer channel closed; its unacked deliveries go back to the queue", "queue", l.queue, "consumer", c.tag)
		} // (a cancel from the broker is told by the cancel watcher)
		select {
		case c.ended <- c: // buffered for every consumer
		default: // serve is gone with its connection: nobody replaces anything
		}
	}
	if c.ch.IsClosed() {
		// Deliveries of a dead channel can never be settled: stop their
		// handlers and waits now; the broker has requeued them.
		c.cancel()
	}
	c.pending.Wait()
	// The handled deliveries whose acks wait go now, before the channel
	// closes, unless the channel is gone or the broker took them back.
	c.acks.close(!c.ch.IsClosed() && !c.brokerCancelled.Load())
	c.cancel()
	c.sv.closeBounded(c.ch.Close)
	if c.forget != nil {
		c.forget()
	}
	if c.finished != nil {
		close(c.finished)
	}
	l.mu.Lock()
	delete(l.consumers, c)
	l.mu.Unlock()
	l.tel.ActiveConsumers.Add(context.Background(), -1, l.attrs.queue.Add...)
}

// gated is the consumer's worker gate around the handler. h is
// CatchPanics(handler): it never panics; the deferred release is for a
// handler that ends its goroutine with runtime.Goexit.
func (c *consumer) gated(h middleware.Handler) middleware.Handler {
	return func(ctx context.Context, d *amqp.Delivery) error {
		start, err := c.enter(ctx, 1)
		if err != nil {
			return err
		}
		returned := false
		defer func() {
			if !returned { // runtime.Goexit in the handler: free the gate for the consumer's other deliveries
				c.leave(start, 1, false)
			}
		}()
		err = h(ctx, d)
		returned = true
		c.leave(start, 1, true)
		return err
	}
}

// enter takes the consumer's gate for a handler call on n deliveries (1, or
// a batch's), and returns when the call began; once shutdown (or a trip) has
// begun, no new call starts.
func (c *consumer) enter(ctx context.Context, n int) (start int64, err error) {
	select {
	case c.gate <- struct{}{}: // free: the usual case, no select machinery
	default:
		if err := c.waitForGate(ctx); err != nil {
			return 0, err
		}
	}
	select {
	case <-c.interrupt: // shutdown (or a trip) began while we waited: no new attempt starts
		<-c.gate
		return 0, &middleware.InterruptedError{Attempt: middleware.Attempt(ctx), Reason: errShuttingDown}
	default:
	}
	start = monotime()
	c.running.Add(int64(n))
	c.busySince.Store(start)
	return start, nil
}

// leave frees the gate after the call enter let in; returned is false for a
// call that ended its goroutine (runtime.Goexit), which is not counted.
func (c *consumer) leave(start int64, n int, returned bool) {
	if returned {
		end := monotime()
		c.busyNanos.Add(end - start)
		c.busySince.Store(0)
		c.calls.Add(uint64(n))
		c.lastActive.Store(end)
	} else {
		c.busySince.Store(0)
	}
	c.running.Add(-int64(n))
	<-c.gate
}

var errShuttingDown = errors.New("shutting down before the handler ran")

// waitForGate waits for the gate held by another delivery's handler.
func (c *consumer) waitForGate(ctx context.Context) error {
	c.waiting.Add(1)
	defer c.waiting.Add(-1)
	select {
	case c.gate <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.interrupt:
		return &middleware.InterruptedError{Attempt: middleware.Attempt(ctx), Reason: errShuttingDown}
	}
}

// process runs one delivery through the chain and settles it.
func (c *consumer) process(dd *delivery) {
	defer c.pending.Done()
	defer c.inFlight.Add(-1)
	defer c.parked.settle(dd)
	returned := false
	defer func() {
		if !returned { // the goroutine is ending in runtime.Goexit (a panic comes back as an error: see call)
			c.goexited(dd)
		}
	}()
	c.handleAndSettle(dd)
	returned = true
}

// handleAndSettle is process's work.
func (c *consumer) handleAndSettle(dd *delivery) {
	l := c.sv.l
	d := &dd.Delivery
	began := dd.received
	ctx, span := l.startProcess(c.ctx, d, &c.spans, began)
	dd.Context = ctx
	var err error
	if count, over := l.overRedeliveryLimit(d); over {
		err = c.callOverLimit(dd, d, count, span)
	} else {
		err = c.call(dd, c.handle, d)
	}
	c.settle(dd, span, err)
}

// settle settles dd once its chain has returned err, on the channel it came
// from, and counts, logs and telemeters the end: an interruption is
// released, not failed; the kill switch counts the outcome; a redelivered
// failure waits before its requeue. span is dd's process span, or
// telemetry.NoSpan for a delivery of a batch (whose span is the batch's):
// the processing time is recorded for each delivery either way. It returns
// the settlement made, or the one meant for a delivery that could not be
// settled (its channel is gone).
func (c *consumer) settle(dd *delivery, span trace.Span, err error) chainrun.Settlement {
	l := c.sv.l
	d := &dd.Delivery
	ctx := dd.Context
	settlement := chainrun.SettlementFor(err)
	if (settlement == chainrun.Requeue || settlement == chainrun.Reject) && ctx.Err() != nil {
		// The listener ended the delivery's context (the shutdown timeout
		// passed, its channel died): what failed then is not the message's
		// fault, even a Permanent error (a lookup cut off, say), and it goes
		// back with a nack, not to the queue's DLX.
		err = &middleware.InterruptedError{Reason: context.Cause(ctx), Last: err}
		settlement = chainrun.Release
	}
	// Processing is over: the span and the duration do not include the
	// requeue delay that may follow.
	l.endProcess(ctx, span, dd.received, err, settlement)
	if l.killSwitch != nil {
		probeFailed := dd.fate != nil && dd.fate.probeFailed
		if o, counted := l.classify(dd, err, settlement); counted && (dd.fate == nil || !dd.fate.recorded) {
			tripped, failedProbe := l.killSwitch.record(time.Now(), o)
			if tripped {
				l.stopAllConsumers()
			}
			probeFailed = probeFailed || failedProbe
		}
		if (settlement == chainrun.Reject || settlement == chainrun.Requeue) && l.tripped() && !probeFailed {
			// (The probe's own failure is settled as the chain says, so a
			// message that fails every time does not fail every probe.)
			// Once the switch has tripped, a failure goes back to the
			// queue untouched, as the chain's recoverer would have had it:
			// a reject without requeue would hand it to the queue's DLX.
			err = &middleware.InterruptedError{Reason: errTripped, Last: err}
			settlement = chainrun.Release
		}
	}
	// A redelivery through the broker (dlx's Redeliver) waits in the queue
	// instead of here.
	redeliver := settlement == chainrun.Requeue && redeliversThroughBroker(err)
	if settlement == chainrun.Requeue && !redeliver {
		c.waitBeforeRequeue(dd)
	}
	if c.brokerCancelled.Load() {
		// The broker took it back when it cancelled the consumer (see
		// admit).
		c.acks.forget(dd.tag)
		l.cfg.logger.Debug("listener: delivery not settled; the broker took it back at the consumer timeout and redelivers it",
			"queue", l.queue, "message_id", d.MessageId, "delivery_tag", d.DeliveryTag)
		return settlement
	}
	wire := settlement
	if settlement == chainrun.Requeue && !redeliver && recoveryFailed(err) {
		// The message failed, but what failed now is putting it somewhere
		// safe (the DLQ publish timed out): it goes back with a nack, which
		// RabbitMQ 4.3 does not count toward the delivery limit, so that the
		// next delivery, after the requeue delay, tries the recovery again
		// (a reject would use up a last delivery, and the broker would
		// dead-letter the message itself, without its fault headers).
		wire = chainrun.Release
	}
	if serr := c.acks.settle(dd.tag, wire); serr != nil {
		l.cfg.logger.Debug("listener: delivery not settled; its channel is gone and the broker requeues it", "queue", l.queue, "delivery_tag", d.DeliveryTag, "error", serr)
		return settlement
	}
	switch settlement {
	case chainrun.Ack: // counted in Handled as its ack is written
		if dd.fate != nil && dd.fate.recovered {
			l.recovered(dd.MessageId, dd.fate)
		}
		return settlement
	case chainrun.Requeue, chainrun.Release:
		l.stats.requeued.Add(1)
	case chainrun.Reject:
		l.stats.rejected.Add(1)
	}
	l.stats.failed.Add(1)
	switch {
	case settlement == chainrun.Release: // the listener's doing, not a failure
	case redeliver:
		// One try of several the broker makes (dlx's Redeliver), as a
		// Retry's attempt is: the dead letter, if it comes to that, is
		// logged at warning level.
		if l.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
			l.cfg.logger.Debug("listener: message failed; the broker delivers it again", "queue", l.queue, "message_id", d.MessageId, "error", errtext.String(err))
		}
	default:
		l.cfg.logger.Warn("listener: message failed", "queue", l.queue, "message_id", d.MessageId, "delivery_tag", d.DeliveryTag, "settlement", settlement.String(), "error", errtext.String(err))
	}
	if settlement == chainrun.Reject && rejectLoops(d, l.queue, err) {
		l.cfg.logger.Error("listener: a message rejected for good came back to this queue after an earlier rejection from it, "+
			"so it may loop: if the queue dead-letters into a retry queue that returns here (dlx.Topology with SingleRetryDelay), "+
			"a Permanent error or recoverer.Reject never reaches a DLQ. End the chain with "+
			"Recover(topo.RejectToRetry(n, recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())))",
			"queue", l.queue, "message_id", d.MessageId, "error", errtext.String(err))
	}
	return settlement
}

// recoveryFailed reports whether err says the chain's recoverer could not
// put the message somewhere safe (middleware.ErrRecoveryFailed), rather
// than asked on purpose for a requeue (recoverer.Requeue).
func recoveryFailed(err error) (yes bool) {
	defer func() {
		if recover() != nil { // an Is, As or Unwrap method of the user's error panicked
			yes = false
		}
	}()
	var onPurpose interface{ RequeuesOnPurpose() bool }
	if errors.As(err, &onPurpose) && onPurpose.RequeuesOnPurpose() {
		return false
	}
	return errors.Is(err, middleware.ErrRecoveryFailed)
}

// redeliversThroughBroker reports whether a recoverer handed the message
// back for the broker to redeliver after its own delay (dlx's Redeliver).
func redeliversThroughBroker(err error) (yes bool) {
	defer func() {
		if recover() != nil { // an Is or Unwrap method of the user's error panicked
			yes = false
		}
	}()
	return errors.Is(err, middleware.ErrRedeliver)
}

// goexited runs as the goroutine handling dd ends in runtime.Goexit (its
// handler called it, as t.FailNow does) rather than returning: the message
// goes back to its queue, and if this goroutine was the consumer's reader,
// a new one takes over, so the consumer lives on.
func (c *consumer) goexited(dd *delivery) {
	l := c.sv.l
	l.cfg.logger.Error("listener: a handler ended its goroutine with runtime.Goexit (t.FailNow or log.Fatal's kin in a handler?) "+
		"instead of returning; its message goes back to the queue and the consumer goes on",
		"queue", l.queue, "message_id", dd.MessageId, "delivery_tag", dd.DeliveryTag)
	if c.brokerCancelled.Load() {
		c.acks.forget(dd.tag)
	} else if err := c.acks.settle(dd.tag, chainrun.SettlementFor(errGoexit)); err == nil {
		l.stats.requeued.Add(1)
		l.stats.failed.Add(1)
	}
	c.current.CompareAndSwap(dd, nil)
	if dd.reader.CompareAndSwap(true, false) {
		dd.handOff()
	}
}

var errGoexit = errors.New("listener: the handler called runtime.Goexit")

// rejectLoops reports whether rejecting d without requeue sends it round
// to its queue again: it has been rejected from queue before and is back,
// and the rejection is not a retry that means to go round
// (dlx.Topology.RejectToRetry's, which says so with RetriesThroughDeadLetters).
func rejectLoops(d *amqp.Delivery, queue string, err error) (loops bool) {
	defer func() {
		if recover() != nil { // an As or Unwrap method of the user's error panicked
			loops = false
		}
	}()
	var retry interface{ RetriesThroughDeadLetters() bool }
	if errors.As(err, &retry) && retry.RetriesThroughDeadLetters() {
		return false
	}
	for _, death := range amqphdr.Deaths(d.Headers) {
		if death.Queue == queue && death.Reason == "rejected" {
			return true
		}
	}
	return false
}

// call runs h, the chain (or what replaces it past the redelivery limit); a
// panic in a middleware outside CatchPanics, or in a recoverer, becomes an
// error too, so one bad message never takes the process down.
func (c *consumer) call(ctx context.Context, h middleware.Handler, d *amqp.Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &middleware.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h(ctx, d)
}

// waitBeforeRequeue delays the requeue of a message that has failed before
// (redelivered), so that a poison message without a recoverer does not cycle
// through the broker as fast as the network allows. Shutdown and channel
// loss end the wait at once.
func (c *consumer) waitBeforeRequeue(dd *delivery) {
	delay := c.sv.l.requeueDelay(&dd.Delivery)
	if delay <= 0 {
		return
	}
	// The delivery is unsettled while it waits: never past the consumer
	// timeout (less a tenth, for the broker's periodic check and the time
	// the delivery spent in the prefetch before it was read), where the
	// broker would take it back uncounted and the failure would not count.
	timeout := c.sv.l.cfg.consumerTimeout
	if left := timeout - timeout/10 - time.Duration(monotime()-dd.received); delay > left {
		if delay = left; delay <= 0 {
			return
		}
	}
	dd.WillWait()
	l := c.sv.l
	l.tel.Parked.Add(c.ctx, 1, l.attrs.queue.Add...)
	defer l.tel.Parked.Add(c.ctx, -1, l.attrs.queue.Add...)
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-c.ctx.Done():
	case <-c.interrupt:
	}
}

func (l *Listener) requeueDelay(d *amqp.Delivery) time.Duration {
	if !d.Redelivered {
		return 0
	}
	delay := l.cfg.requeueDelay
	if delay == 0 {
		return 0
	}
	if n := amqphdr.DeliveryCount(d.Headers); n > 1 {
		for i := 1; i < n && delay < l.cfg.requeueDelayMax; i++ {
			delay *= 2
		}
	}
	return min(delay, l.cfg.requeueDelayMax)
}

// tellDeliveryCounting says once, when the first x-delivery-count arrives,
// that the queue counts deliveries: the listener cannot read the queue's
// limit over AMQP, and past it the broker dead-letters or drops the message.
func (l *Listener) tellDeliveryCounting(h amqp.Table) {
	if _, ok := h[amqphdr.XDeliveryCount]; !ok || !l.countsToldOnce.CompareAndSwap(false, true) {
		return
	}
	l.cfg.logger.Info("listener: the queue counts deliveries (a quorum queue): every requeue after a failure is one, "+
		"and past the queue's delivery limit (x-delivery-limit or a delivery-limit policy; 20 by default on RabbitMQ 4) "+
		"the broker dead-letters the message, or drops it if the queue has no dead-letter exchange",
		"queue", l.queue, amqphdr.XDeliveryCount, h[amqphdr.XDeliveryCount])
}

// sample returns the consumer's busy fraction and completed calls since the
// last sample.
func (c *consumer) sample(now int64, window time.Duration) (busy float64, calls uint64) {
	total := c.busyNanos.Load()
	if since := c.busySince.Load(); since != 0 && since < now {
		total += now - since
	}
	n := c.calls.Load()
	busy = float64(total-c.sampledBusy) / float64(window)
	calls = n - c.sampledCalls
	c.sampledBusy, c.sampledCalls = total, n
	return min(max(busy, 0), 1), calls
}

// newSettler returns the settler of a consumer on ch at prefetch: it
// coalesces acks with WithAckCoalescing, at most the prefetch of them (a
// consumer at prefetch 1 acks each at once).
func (l *Listener) newSettler(ch amqp.Acknowledger, prefetch int, tag string) *settler {
	lost := func(n int, err error) {
		l.cfg.logger.Info("listener: acks of handled deliveries not written: their channel is gone, and the broker redelivers them (WithAckCoalescing)",
			"queue", l.queue, "consumer", tag, "deliveries", n, "error", err)
	}
	return newSettler(ch, &l.stats.handled, min(l.cfg.coalesceAcks, prefetch), l.cfg.coalesceDelay, lost)
}

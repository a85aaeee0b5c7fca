package listener

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/errtext"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
)

// The delivery pipeline: one delivery's path from its channel to its
// settlement, top to bottom.
//
//	received  read, admit: the channel's reader takes it in: unreadable
//	          headers are rejected, what arrives at a stopping consumer goes
//	          back, and the rest is in flight (the channel: channel.go).
//	gathered  batch.go (NewBatch only): collected into a batch, whose handler
//	          call is one slot of the pool; each failed message of a batch then
//	          takes the path below on its own.
//	handled   process, handleAndSettle: past WithRedeliveryLimit straight to
//	          the recoverer (redelivery.go), else through the chain, whose
//	          handler runs in a slot of the listener's pool (gated, enter,
//	          leave; pool.go). With a pool of several slots the reader hands
//	          the reading on as the handler takes its slot; a wait between
//	          attempts does the same and holds no slot (delivery.go: WillWait).
//	settled   settle: an interruption is released, the kill switch counts the
//	          outcome (killswitch.go), a redelivered failure waits before its
//	          requeue (waitBeforeRequeue), and the settlement goes on the
//	          delivery's own channel, at once or coalesced (coalesce.go).

// A goroutine whose delivery went on off the reader (it parked, or ran
// beside the reader in a pool of several slots) stays, once that delivery
// is settled, as a spare: the next hand-off wakes it to read rather than
// start a goroutine, whose stack would grow again on the handler's first
// calls. Spares end as the consumer finishes.
func (c *consumer) read() {
	defer c.sv.consumers.Done()
	for {
		if c.readOn() {
			c.finish()
			return
		}
		select {
		case <-c.spare: // the reading is ours again
		case <-c.finished:
			return
		}
	}
}

// readOn reads and handles deliveries until the deliveries channel closes
// (true) or one of them goes on off the reader (false: another goroutine
// reads now).
func (c *consumer) readOn() (closed bool) {
	for {
		d, at, ok := c.next()
		if !ok {
			return true
		}
		dd := c.admit(&d, at)
		if dd == nil {
			continue
		}
		dd.reader.Store(true)
		c.current.Store(dd)
		c.process(dd)
		c.inlineWatch.disarm(dd)          // armed by gated, if at all
		c.current.CompareAndSwap(dd, nil) // unless another reader has a newer one
		if !dd.reader.CompareAndSwap(true, false) {
			return false
		}
		// Done with dd: a late WillWait on it (from a goroutine its handler
		// left behind) finds reader false and starts no second reader.
	}
}

// admit takes in a delivery just read, which arrived at the monotime at: it
// returns it in flight, or nil for one that is not to be handled (nacked
// here, or left to the broker).
func (c *consumer) admit(d *amqp.Delivery, at int64) *delivery {
	if c.brokerCancelled.Load() {
		// The broker has taken back every unacked delivery of this
		// consumer (a 4.3 consumer timeout, or its queue is gone) and
		// gives them to another: handling them here would do the work
		// twice, and settling them is worse than useless (on RabbitMQ
		// 4.3.6 a late nack or reject here could make another of them
		// count as a failed delivery).
		return nil
	}
	if c.ch.IsClosed() {
		// The channel is gone, and the broker has requeued what it held:
		// a delivery still in the client's buffer is another consumer's
		// now, and handling it would do the work twice.
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
	if l := c.sv.l; !l.parallel.Load() && !l.keepsOrder() {
		now := monotime()
		c.firstAdmit.CompareAndSwap(0, now)
		c.lastAdmit.Store(now)
		l.seeSideBySide(c)
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
	return &delivery{Delivery: *d, c: c, received: at, id: d.MessageId, tag: d.DeliveryTag}
}

// process runs one delivery through the chain and settles it, or leaves
// it to settle when its recoverer's outcome comes (settleLater).
func (c *consumer) process(dd *delivery) {
	returned := false
	defer func() {
		if !returned { // the goroutine is ending in runtime.Goexit (a panic comes back as an error: see call)
			c.goexited(dd)
			c.done(dd)
		}
	}()
	later := c.handleAndSettle(dd)
	returned = true
	if !later {
		c.done(dd)
	}
}

// done ends dd's time in flight, once it is settled.
func (c *consumer) done(dd *delivery) {
	c.parked.settle(dd)
	c.inFlight.Add(-1)
	c.pending.Done()
}

// handleAndSettle is process's work; later says that dd settles when its
// recoverer's outcome comes (DeferSettlement), not now.
func (c *consumer) handleAndSettle(dd *delivery) (later bool) {
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
	if dd.fate != nil && dd.fate.deferral.Load() != notDeferred {
		dd.fate.span = span // before the outcome may read it
		if dd.fate.deferral.CompareAndSwap(deferredInChain, deferredAwaiting) {
			return true
		}
		// The outcome came while the chain was returning: it is the
		// chain's result (the chain returned nil, or what was known at once).
		dd.fate.deferral.Store(deferredDone)
		err = dd.fate.lateErr
	}
	c.settle(dd, span, err)
	return false
}

// settleLater settles dd, whose settlement was deferred, with its outcome:
// on the goroutine that brought it (the publisher's, for a confirm), which
// an ack does not hold up. A failure, which may wait before its requeue
// (waitBeforeRequeue), settles on a goroutine of its own.
func (c *consumer) settleLater(dd *delivery, err error) {
	if chainrun.SettlementFor(err) == chainrun.Ack && dd.Context.Err() == nil {
		c.settle(dd, dd.fate.span, err)
		c.done(dd)
		return
	}
	c.sv.consumers.Add(1) // dd is pending: its consumer's reader has not finished
	go func() {
		defer c.sv.consumers.Done()
		c.settle(dd, dd.fate.span, err)
		c.done(dd)
	}()
}

// gated runs the handler in a slot of the listener's pool. h is
// CatchPanics(handler): it never panics; the deferred release is for a
// handler that ends its goroutine with runtime.Goexit.
//
// With a pool of more than one slot, the goroutine that read the delivery
// hands the reading to a new one once the handler has its slot (WillWait,
// as for a wait between retries), so that the next delivery can run beside
// it; unless the consumer's handlers have been quick (handOffWhenSlower):
// then the reader runs the handler itself, and hands the reading on only if
// the delivery stays on the reader past inlineFor from here (inlineWatch).
// With one slot it keeps reading after the handler: the next delivery could
// not run before anyway, and a healthy message costs no goroutine.
func (c *consumer) gated(h middleware.Handler) middleware.Handler {
	pool := c.sv.l.pool
	return func(ctx context.Context, d *amqp.Delivery) error {
		start, err := c.enter(ctx, 1)
		if err != nil {
			return err
		}
		dd, _ := ctx.Value(chainctx.WaitHookKey).(*delivery)
		if dd != nil {
			if pool.parallel() && c.b == nil && dd.reader.Load() {
				if c.handlerNanos.Load() >= int64(handOffWhenSlower) {
					dd.WillWait()
				} else {
					c.inlineWatch.arm(dd) // until the reader is done with dd (readOn)
				}
			}
			dd.inHandler.Store(true) // for Stats' OldestRunning
		}
		returned := false
		defer func() {
			if !returned { // runtime.Goexit in the handler: free the slot for other deliveries
				c.leave(start, 1, false)
			}
			if dd != nil {
				dd.inHandler.Store(false)
			}
		}()
		err = h(ctx, d)
		returned = true
		c.leave(start, 1, true)
		return err
	}
}

// Handing the reading on costs a goroutine switch, often a goroutine start
// and its stack's growth, and the parked list's lock: several microseconds
// a delivery, more than a quick handler takes, paid on every message of a
// busy queue. So a reader whose consumer's handlers have taken less than
// handOffWhenSlower (a running mean) runs the next one itself, and a timer,
// armed as the handler takes its slot, hands the reading on if the delivery
// stays on the reader past inlineFor, in its handler or in the rest of its
// chain (a recoverer's publish waiting for room): a slow call among quick
// ones holds the channel's next deliveries back from free slots by that
// much at most. (Timers shorter than a millisecond fire about a millisecond
// late in an idle process anyway.)
const (
	handOffWhenSlower = 20 * time.Microsecond
	inlineFor         = time.Millisecond
)

// inlineWatch is a consumer's timer for the delivery its reader handles
// (gated arms it, readOn disarms it). Only the reader arms it, but the
// goroutine it watched may disarm it later, when it is no longer the
// reader (the timer handed the reading on meanwhile): so it is disarmed
// only for the delivery it watches now.
type inlineWatch struct {
	mu    sync.Mutex
	timer *time.Timer
	dd    *delivery // whose handler it watches, nil when disarmed
}

func newInlineWatch() *inlineWatch {
	w := &inlineWatch{}
	w.timer = time.AfterFunc(time.Hour, w.fire)
	w.timer.Stop()
	return w
}

// arm watches dd, whose handler the reader is about to run.
func (w *inlineWatch) arm(dd *delivery) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dd = dd
	w.timer.Reset(inlineFor)
}

// disarm ends the watch of dd, once the reader is done with it. A timer that
// fired meanwhile has handed the reading on, or finds dd no longer the
// reader's and does nothing: WillWait acts once, and only on the reader's
// delivery.
func (w *inlineWatch) disarm(dd *delivery) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dd == dd {
		w.timer.Stop()
		w.dd = nil
	}
}

// fire runs on the timer's goroutine when a delivery has been on the
// reader for inlineFor since its handler began: it goes on off the reader,
// as it would have at once with slower handlers.
func (w *inlineWatch) fire() {
	w.mu.Lock()
	dd := w.dd
	w.mu.Unlock()
	if dd != nil {
		dd.handOffLate()
	}
}

// enter takes a slot of the listener's pool for a handler call on n
// deliveries (1, or a batch's), and returns when the call began; once
// shutdown (or a trip) has begun, no new call starts.
func (c *consumer) enter(ctx context.Context, n int) (start int64, err error) {
	pool := c.sv.l.pool
	if err := pool.enter(ctx, c.interrupt, &c.waiting); err != nil {
		return 0, err
	}
	if !pool.hold(&c.slots) {
		return 0, errChannelGone // its slots were forgiven: the channel is gone
	}
	select {
	case <-c.interrupt: // shutdown (or a trip) began while we waited: no new attempt starts
		pool.leave(&c.slots)
		return 0, &middleware.InterruptedError{Attempt: middleware.Attempt(ctx), Reason: errShuttingDown}
	default:
	}
	if err := ctx.Err(); err != nil {
		// Its context ended while it waited (its channel died, a Timeout's
		// deadline passed): the handler would only find it so.
		pool.leave(&c.slots)
		return 0, err
	}
	start = monotime()
	c.running.Add(int64(n))
	return start, nil
}

// leave frees the slot after the call enter let in; returned is false for a
// call that ended its goroutine (runtime.Goexit), which is not counted.
func (c *consumer) leave(start int64, n int, returned bool) {
	if returned {
		end := monotime()
		c.busyNanos.Add(end - start)
		// A running mean over about the last eight calls (gated): of two
		// calls that end together, one may be lost, which it can spare.
		mean := c.handlerNanos.Load()
		c.handlerNanos.Store(mean + (end-start-mean)/8)
		c.calls.Add(uint64(n))
		c.lastActive.Store(end)
	}
	c.running.Add(-int64(n))
	c.sv.l.pool.leave(&c.slots)
}

var (
	errShuttingDown = errors.New("shutting down before the handler ran")
	errChannelGone  = errors.New("its channel is gone: the broker redelivers it")
)

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
		// Limited as the dead letters' warnings are: a queue that rejects
		// every failure to its own dead-letter exchange, or a downstream out
		// for every message, fails thousands a minute.
		cause := err
		if dd.fate != nil && dd.fate.failedFor != nil {
			cause = dd.fate.failedFor // the handler's, not the recoverer's answer (recoverer.Reject)
		}
		full, summary := l.failures.take(time.Now(), settlement.String()+" "+chainrun.ErrorType(cause))
		l.logSummary(l.failures, summary)
		if full {
			l.cfg.logger.Warn("listener: message failed", "queue", l.queue, "message_id", d.MessageId, "delivery_tag", d.DeliveryTag, "settlement", settlement.String(), "error", errtext.String(err))
		}
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

package listener

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/telemetry"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// BatchHandler handles a batch of deliveries at once: one multi-row INSERT,
// one bulk API call. batch holds 1 to the batch size deliveries, in the
// order the broker sent them; the slice and the deliveries are the
// handler's until it returns, and it must not settle them (the listener
// does).
//
// It returns nil when every message is handled: all are acked. It returns
// PerMessage(errs), with one error per delivery of the batch (nil for a
// success), when some failed: the successes are acked and each failure goes
// through the listener's middleware alone (see NewBatch). Any other error,
// or a panic, fails the whole batch: every message of it goes through the
// middleware with that error. PerMessage with a slice of another length than
// the batch's is a mistake that fails the whole batch too, with
// ErrBatchResults. The handler may reorder batch in place (sort it to take
// row locks in one order): PerMessage's errs[i] is then the result of the
// delivery batch holds at i when the handler returns. A batch that no longer
// holds exactly the deliveries it was given fails with ErrBatchResults.
type BatchHandler func(ctx context.Context, batch []*amqp.Delivery) error

// NewBatch returns a Listener that hands its handler batches of up to size
// deliveries: a batch is handed on as soon as it is full, or wait after its
// first delivery arrived with whatever has come by then (Spring AMQP's
// consumerBatchEnabled with batchSize and receiveTimeout; MassTransit's
// Batch<T> with MessageLimit and TimeLimit). wait 0 takes only what has
// arrived already. It also ends early when the consumer can receive no more
// (every prefetch slot is taken, as by deliveries waiting between retries).
// Everything else is New's: the options, the scaling (each consumer
// collects and handles its own batches, one at a time), the shutdown, the
// reconnection, the kill switch and the telemetry.
//
// The messages of a batch that succeeds are acked. A message that fails
// (its PerMessage error, or the batch's error or panic) goes through mw
// alone, as a message of New's listener would: mw runs with a handler whose
// first call returns the error the batch gave the message, and whose later
// calls run h on a batch of that one message. So Retry(5) means five
// attempts in all, the batch's counting as the first; a Permanent error, or
// retries exhausted, goes to the chain's Recover; and failed messages never
// hold up the next batch: while one waits between retries, the consumer
// reads and handles the next batches. mw is the policy for failures only:
// the batch call itself goes through none of it (a middleware.Timeout in mw
// bounds the retries of one message, not the batch call).
//
// A shutdown lets a running batch finish within WithShutdownTimeout, then
// cancels its context; its failures then go back to the queue with a nack,
// as New's would, and none reaches the recoverer. A batch that had not
// started goes back whole. A lost channel takes back whatever is unsettled.
//
// The consumer's prefetch (WithPrefetch) must be at least size, or no batch
// could fill: NewBatch refuses less. A batch's successes are acked with one
// basic.ack(multiple=true), as WithAckCoalescing(size, 10ms) does (its
// trade-off, at most size redeliveries per consumer after a lost
// connection, included); an explicit WithAckCoalescing sets other bounds. Each batch gets one CONSUMER span,
// "process <queue>", with messaging.batch.message_count and a link to each
// message's producer span (from its traceparent header); a failed message
// adds a "message failed" event, and once the last of its messages is
// settled the span ends, with an error status when any was not acked. The
// retries of a failed message are attempt spans under it. The listener's
// metrics count each message, as New's do (Retry's count the attempts of
// the failed messages, the only ones that go through it).
// WithProducerAsParent does not apply: a batch has many producers.
func NewBatch(queue string, mw middleware.Middleware, h BatchHandler, size int, wait time.Duration, opts ...Option) (*Listener, error) {
	var standIn middleware.Handler
	if h != nil {
		standIn = func(context.Context, *amqp.Delivery) error { return nil }
	}
	return newListener("NewBatch", queue, mw, standIn, &batchConfig{handler: h, size: size, wait: wait}, opts)
}

// batchConfig is NewBatch's.
type batchConfig struct {
	handler BatchHandler
	size    int
	wait    time.Duration
}

// check records what is wrong with the batch settings against cfg.
func (b *batchConfig) check(cfg *config) {
	if b.size < 1 {
		cfg.fail("NewBatch expects a batch size of at least 1, got %d", b.size)
	}
	if b.wait < 0 {
		cfg.fail("NewBatch expects a batch wait of at least 0, got %v", b.wait)
	}
	if b.size > cfg.prefetch && cfg.prefetch > 0 {
		cfg.fail("NewBatch: a batch size of %d needs WithPrefetch(%d) or more, got a prefetch of %d: "+
			"the broker sends a consumer no more than its prefetch of unacked messages, so no batch could fill", b.size, b.size, cfg.prefetch)
	}
	if cfg.coalesceAcks == 0 && b.size >= 2 && (cfg.prefetch == 0 || b.size <= cfg.prefetch) {
		// (A size past the prefetch is refused above, naming WithPrefetch:
		// not WithAckCoalescing, which the user did not pass.)
		// A batch's successes go out as one multiple ack: they are settled
		// one after another, so the last completes the run at once.
		cfg.coalesceAcks, cfg.coalesceDelay = b.size, batchAckDelay
	}
}

// batchAckDelay bounds how long the acks of a batch's successes may wait
// when the run they form is cut short (a failure of the batch still
// retrying before them): then they are acked one by one.
const batchAckDelay = 10 * time.Millisecond

// batchConsumer is a consumer's batch-mode state.
type batchConsumer struct {
	h     BatchHandler
	size  int
	wait  time.Duration
	timer *time.Timer // the current reader's, for the wait
	// alone runs the handler on a batch of one, for the retries of a
	// failed message: gated(batchOfOne).
	alone middleware.Handler
	// collecting: deliveries read for a batch that has not started yet,
	// for Stats (neither running nor parked).
	collecting atomic.Int64
}

func newBatchConsumer(c *consumer) *batchConsumer {
	l := c.sv.l
	b := &batchConsumer{h: l.batch.handler, size: l.batch.size, wait: l.batch.wait}
	b.timer = time.NewTimer(time.Hour)
	b.timer.Stop()
	b.alone = c.gated(c.batchOfOne)
	// A failed message's chain: the batch's error first, then the handler
	// alone. CatchPanics turns a panic of the handler into an error, and
	// checks the batch's error as it checks a handler's.
	c.handle = l.mw(middleware.CatchPanics()(c.retryAlone))
	return b
}

// batchRun is one batch, from its collection until its last message is
// settled. Its failures' chains run one after the other on the reader's
// goroutine; when one of them parks (WillWait), the goroutine stays with it
// and a new one runs the rest (from next) before it reads on.
type batchRun struct {
	c    *consumer
	dds  []*delivery
	msgs []*amqp.Delivery // the handler's batch: dds' deliveries, those past the redelivery limit left out

	// first[i] is what the batch said of dds[i], which its chain's first
	// call returns (see retryAlone); overLimit[i]: it goes to the recoverer
	// without running (WithRedeliveryLimit). Written before the failures
	// run, then each read by its own chain.
	first     []error
	overLimit []bool
	failed    []int // indexes of dds whose chains run, in order
	next      int   // the next of failed to run

	// detached: the batch runs off the reader, beside the batches read
	// after it (a pool of several slots): a failure's wait hands the rest of
	// its failures to a new goroutine, not the reading.
	detached bool

	span      batchSpan
	unsettled atomic.Int32 // messages not settled yet: the last one ends the span
	notAcked  atomic.Int32
}

// runBatch handles a collected batch on the reader's goroutine: the
// handler on the batch, the successes acked, then each failure's chain. It
// returns false when this goroutine no longer reads: a failure parked.
func (c *consumer) runBatch(run *batchRun) bool {
	l := c.sv.l
	n := len(run.dds)
	run.unsettled.Store(int32(n))
	run.first = make([]error, n)
	if !run.detached {
		c.current.Store(run.dds[0]) // the oldest, for the age watch
	}
	ctx := run.start(c.ctx)
	for _, dd := range run.dds {
		dd.Context = ctx
	}
	run.msgs = make([]*amqp.Delivery, 0, n)
	for i, dd := range run.dds {
		if _, over := l.overRedeliveryLimit(&dd.Delivery); over {
			if run.overLimit == nil {
				run.overLimit = make([]bool, n)
			}
			run.overLimit[i] = true
			continue
		}
		run.msgs = append(run.msgs, &dd.Delivery)
	}
	called := false
	defer func() {
		if !called { // runtime.Goexit in the handler
			c.batchGoexited(run)
		}
	}()
	results := c.callBatch(ctx, run)
	called = true
	if !run.detached {
		c.current.CompareAndSwap(run.dds[0], nil)
	}
	run.msgs = nil
	for i, dd := range run.dds {
		switch {
		case run.overLimit != nil && run.overLimit[i]:
			run.failed = append(run.failed, i)
		case results[i] == nil:
			c.settleBatched(run, dd, nil)
			run.dds[i] = nil // a failure's long retries need not keep it
		default:
			run.first[i] = results[i]
			run.failed = append(run.failed, i)
			run.span.failed(dd, results[i])
		}
	}
	return c.runFailures(run)
}

// inHandler marks run's deliveries as in a handler call, or no longer, for
// Stats' OldestRunning.
func (run *batchRun) inHandler(on bool) {
	for _, dd := range run.dds {
		dd.inHandler.Store(on)
	}
}

// callBatch runs the handler on run's batch under the consumer's gate and
// returns one result per delivery of run (those past the redelivery limit
// get nil: they did not run). A panic, or an error other than PerMessage's,
// is every message's result.
func (c *consumer) callBatch(ctx context.Context, run *batchRun) []error {
	n := len(run.msgs)
	results := make([]error, len(run.dds))
	if n == 0 {
		c.b.collecting.Add(-int64(len(run.dds)))
		return results
	}
	start, err := c.enter(ctx, n)
	c.b.collecting.Add(-int64(len(run.dds)))
	if err == nil {
		returned := false
		func() {
			defer func() {
				if !returned { // runtime.Goexit: batchGoexited settles the batch
					c.leave(start, n, false)
				}
			}()
			run.inHandler(true)
			defer run.inHandler(false)
			err = c.invokeBatch(ctx, run.msgs)
			returned = true
		}()
		c.leave(start, n, true)
	}
	perMessage := batchResults(err, n)
	if me, ok := asMessageErrors(err); !ok || len(me.Errs) != n {
		// One result for all (or none failed): order does not matter.
		for i := range run.dds {
			if run.overLimit == nil || !run.overLimit[i] {
				results[i] = perMessage(0)
			}
		}
		return results
	}
	// PerMessage's errs[k] is the result of the delivery the slice holds at k
	// when the handler returns: a handler may sort its batch in place (to
	// take row locks in one order), so match results by identity, not by
	// the order the broker sent.
	at := make(map[*amqp.Delivery]int, n)
	for i, dd := range run.dds {
		if run.overLimit == nil || !run.overLimit[i] {
			at[&dd.Delivery] = i
		}
	}
	for k, d := range run.msgs {
		i, ok := at[d]
		if !ok { // not of this batch, or there twice
			wrong := fmt.Errorf("%w: the handler replaced a delivery of its batch (message %d of %d is not one it was given, or is there twice); "+
				"reorder the batch in place if you must, but keep its deliveries", ErrBatchResults, k, n)
			for i := range run.dds {
				if run.overLimit == nil || !run.overLimit[i] {
					results[i] = wrong
				}
			}
			return results
		}
		delete(at, d)
		results[i] = perMessage(k)
	}
	return results
}

// invokeBatch calls the handler; a panic becomes a *middleware.PanicError.
func (c *consumer) invokeBatch(ctx context.Context, batch []*amqp.Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &middleware.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return c.b.h(ctx, batch)
}

// batchOfOne is the handler of a failed message's retries: the batch
// handler on a batch of that message alone.
func (c *consumer) batchOfOne(ctx context.Context, d *amqp.Delivery) error {
	return batchResults(c.b.h(ctx, []*amqp.Delivery{d}), 1)(0)
}

// retryAlone is the handler below the middleware of a failed message: its
// first call returns what the batch said of the message, the later ones
// run the handler on the message alone.
func (c *consumer) retryAlone(ctx context.Context, d *amqp.Delivery) error {
	if dd, ok := ctx.Value(chainctx.WaitHookKey).(*delivery); ok && dd.inBatch() != nil {
		if run, i := dd.fate.batch, dd.fate.index; run.first[i] != nil {
			err := run.first[i]
			run.first[i] = nil
			return err
		}
	}
	return c.b.alone(ctx, d)
}

// runFailures runs the chain of each failed message of run from run.next
// on, on this goroutine. It returns false when one of them parked: this
// goroutine stays with it, and the one its WillWait started runs the rest.
func (c *consumer) runFailures(run *batchRun) bool {
	for run.next < len(run.failed) {
		dd := run.dds[run.failed[run.next]]
		run.next++ // before the chain runs: a WillWait hands the rest over
		dd.reader.Store(true)
		c.current.Store(dd)
		c.processFailed(run, dd)
		c.current.CompareAndSwap(dd, nil)
		if !dd.reader.CompareAndSwap(true, false) {
			return false
		}
	}
	return true
}

// processFailed runs one failed message of a batch through the chain (or,
// past the redelivery limit, to the recoverer) and settles it.
func (c *consumer) processFailed(run *batchRun, dd *delivery) {
	defer c.pending.Done()
	defer c.inFlight.Add(-1)
	defer c.parked.settle(dd)
	returned := false
	defer func() {
		if !returned { // runtime.Goexit in the handler, on a batch of one
			c.goexited(dd)
			run.settled(chainrun.Requeue)
		}
	}()
	d := &dd.Delivery
	var err error
	if run.overLimit != nil && run.overLimit[dd.fate.index] {
		count, _ := c.sv.l.overRedeliveryLimit(d)
		err = c.callOverLimit(dd, d, count, run.span.span)
	} else {
		err = c.call(dd, c.handle, d)
	}
	s := c.settle(dd, telemetry.NoSpan, err)
	run.span.settled(dd, s)
	run.settled(s)
	returned = true
}

// settleBatched settles a message of run whose batch succeeded for it.
func (c *consumer) settleBatched(run *batchRun, dd *delivery, err error) {
	s := c.settle(dd, telemetry.NoSpan, err)
	c.pending.Done()
	c.inFlight.Add(-1)
	c.parked.settle(dd)
	run.settled(s)
}

// settled notes that a message of run is settled: the last one ends the
// batch's span.
func (run *batchRun) settled(s chainrun.Settlement) {
	if s != chainrun.Ack {
		run.notAcked.Add(1)
	}
	if run.unsettled.Add(-1) == 0 {
		run.span.end(len(run.dds), int(run.notAcked.Load()))
	}
}

// batchGoexited runs as the reader's goroutine ends in runtime.Goexit
// inside the batch handler: every message of the batch goes back to the
// queue, and a new goroutine reads.
func (c *consumer) batchGoexited(run *batchRun) {
	l := c.sv.l
	l.cfg.logger.Error("listener: a batch handler ended its goroutine with runtime.Goexit (t.FailNow or log.Fatal's kin in a handler?) "+
		"instead of returning; its messages go back to the queue and the consumer goes on",
		"queue", l.queue, "batch", len(run.dds))
	for _, dd := range run.dds {
		if c.brokerCancelled.Load() {
			c.acks.forget(dd.tag)
		} else if err := c.acks.settle(dd.tag, chainrun.SettlementFor(errGoexit)); err == nil {
			l.stats.requeued.Add(1)
			l.stats.failed.Add(1)
		}
		c.pending.Done()
		c.inFlight.Add(-1)
		c.parked.settle(dd)
		run.settled(chainrun.Requeue)
	}
	if !run.detached {
		c.current.CompareAndSwap(run.dds[0], nil)
		c.spawnReader()
	}
}

package listener

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
)

// A delivery in flight and its states:
//
//	received  read and admitted on its channel's reader goroutine
//	          (channel.go), the reader's current one;
//	running   its handler holds a slot of the pool (pipeline.go: enter);
//	waiting   between attempts, for a backoff, a recoverer's publish or a
//	          requeue delay: parked, holding no slot, off the reader
//	          (WillWait), in its consumer's parked list (age.go);
//	settled   acked, rejected or nacked on its channel, or left to the
//	          broker once the channel is gone (pipeline.go: settle).

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
	inHandler  atomic.Bool  // a handler call on it runs now (for Stats)
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
	listed      bool  // DeferSettlement parked it (Undo takes it off the list again)

	recovered  bool   // its recoverer put it elsewhere (RecoveredTo): acked, it counts as recovered
	told       bool   // ... and said where (to, deadLetter)
	to         string // where its recoverer put it, for the log
	attempts   int    // ... after so many failed attempts
	deadLetter bool   // ... as a dead letter, not a retry hop

	// batch mode: the batch it came in and its place there (batch.go)
	batch *batchRun
	index int

	// A deferred settlement (DeferSettlement): where it stands, the process
	// span, ended at the settlement, and the outcome when it came before
	// the chain returned.
	deferral atomic.Int32
	span     trace.Span
	lateErr  error

	// What DeferSettlement hands out, kept here rather than allocated per
	// failed message: the context of the recoverer's work, and dd's place
	// in the parked list (unless it parked before, with a link of its own).
	ended listenerEnded
	link  parkLink
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

// WillWait parks the delivery: it hands the reading of deliveries to a new
// goroutine, once. The chain calls it before a wait (a backoff, a
// recoverer's publish, a requeue delay), and gated as the handler takes its
// slot in a pool of several: the delivery goes on off the reader, in the
// parked list, where the age watch finds it.
func (dd *delivery) WillWait() {
	if dd.leaveReader() {
		dd.handOff()
	}
}

// handOffLate is WillWait from the inline watch's timer (inlineWatch), on
// a goroutine other than dd's: the watch is armed only outside batch mode,
// so it hands the reading on without looking at dd's recovery record, which
// dd's goroutine may be writing meanwhile.
func (dd *delivery) handOffLate() {
	if dd.leaveReader() {
		dd.c.handOffReading()
	}
}

// leaveReader parks dd if it is still its reader's, once: then the caller
// hands the reading on.
func (dd *delivery) leaveReader() bool {
	if !dd.reader.CompareAndSwap(true, false) {
		return false
	}
	dd.c.parked.park(dd, nil)
	// Parked, it is no longer the reader's current one (the parked list
	// has it for the age watch): a careful start that waits for the
	// consumer to be idle must not wait for its retries.
	dd.c.current.CompareAndSwap(dd, nil)
	return true
}

// handOff starts the goroutine that reads in place of dd's, which stays
// with dd: in batch mode it first runs the chains of the rest of dd's
// batch's failures.
func (dd *delivery) handOff() {
	if run := dd.inBatch(); run != nil {
		if run.detached {
			dd.c.spawnFailures(run) // another goroutine reads already
		} else {
			dd.c.spawnBatchReader(run)
		}
		return
	}
	dd.c.handOffReading()
}

// handOffReading has a spare goroutine, or a new one, read on.
func (c *consumer) handOffReading() {
	select {
	case c.spare <- struct{}{}: // a spare reads on (read)
	default:
		c.spawnReader()
	}
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

// Where a deferred settlement stands (recovery.deferral).
const (
	notDeferred      int32 = iota
	deferredInChain        // deferred; the chain runs on
	deferredAwaiting       // the chain has returned: the outcome settles it (settleLater)
	deferredEarly          // the outcome came before the chain returned: the chain's end settles it
	deferredDone
)

// DeferSettlement lets the chain's recoverer (middleware.AsyncRecoverer:
// recoverer.Republish) settle dd when its outcome comes, rather than when
// the chain returns: the copy is published, the reader goes on reading, and
// the original is acked when the broker confirms the copy (or goes back
// when it does not), in whatever order the confirms come. No goroutine
// waits for it meanwhile. dd is parked meanwhile, for the age watch and
// Stats, holding no slot. Not in batch mode, whose batches settle together.
// What it returns is dd itself (Outcome, Undo) and a context in dd's
// recovery record: nothing is allocated for it.
func (dd *delivery) DeferSettlement(chain context.Context) (context.Context, chainctx.DeferredSettlement) {
	c := dd.c
	if c.b != nil {
		return nil, nil
	}
	fate := dd.recovery() // allocated here, on the chain's goroutine, before the outcome can come
	if !fate.deferral.CompareAndSwap(notDeferred, deferredInChain) {
		return nil, nil
	}
	fate.listed = c.parked.park(dd, &fate.link)
	fate.ended = listenerEnded{Context: c.ctx, values: chain}
	return &fate.ended, dd
}

// Undo takes back the deferral DeferSettlement made, on the chain's
// goroutine, before the recoverer started anything: dd settles as its
// chain returns.
func (dd *delivery) Undo() {
	fate := dd.fate
	if fate.deferral.CompareAndSwap(deferredInChain, notDeferred) && fate.listed {
		dd.c.parked.unpark(dd)
	}
}

// Outcome is the deferred settlement's outcome, called once.
func (dd *delivery) Outcome(err error) {
	dd.fate.lateErr = err
	if dd.fate.deferral.CompareAndSwap(deferredInChain, deferredEarly) {
		return // the chain has not returned yet: its end settles dd
	}
	if dd.fate.deferral.CompareAndSwap(deferredAwaiting, deferredDone) {
		dd.c.settleLater(dd, err)
	}
}

// listenerEnded is the context of a deferred settlement's work: the chain's
// values, ended only when the listener ends its deliveries' contexts (the
// shutdown timeout, a lost channel), not when something in the chain
// returns. Its methods take a pointer: DeferSettlement hands out the one in
// a delivery's recovery record, where boxing a copy would allocate.
type listenerEnded struct {
	context.Context
	values context.Context
}

func (l *listenerEnded) Value(key any) any { return l.values.Value(key) }

// AfterFunc lets a context made from this one (the recoverer's publish
// timeout, the publisher's watch) hear of its end the way it would hear of
// the listener's own context's: with no goroutine waiting for it, which the
// context package would otherwise start per context of a type it does not
// know.
func (l *listenerEnded) AfterFunc(f func()) (stop func() bool) {
	return context.AfterFunc(l.Context, f)
}

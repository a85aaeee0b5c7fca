package listener

import (
	"cmp"
	"context"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/telemetry"
	"github.com/amqpretry/amqpretry/middleware"
)

// consumer is one channel with its own prefetch and basic.consume. Its
// deliveries' handlers run in the listener's pool of handler slots
// (pool.go), side by side with each other and with other channels' when the
// pool has more than one slot: a slot is held while a handler runs and free
// while a delivery waits between retries.
type consumer struct {
	sv      *supervisor
	ch      *amqp.Channel
	tag     string
	ahead   readAhead // its deliveries that arrived and were not taken in yet (readahead.go)
	ended   chan<- *consumer
	pending sync.WaitGroup  // deliveries in flight, on any goroutine
	ctx     context.Context // for its deliveries: cancelled when the channel dies or handlers time out
	cancel  context.CancelFunc
	handle  middleware.Handler // mw(gated(CatchPanics(h))); in batch mode, the chain of a failed delivery (batch.go)
	b       *batchConsumer     // batch mode's state (batch.go); nil for a Handler
	acks    *settler           // settles its deliveries on ch (coalesce.go)
	spans   spanBuffers        // for startProcess, used by the current reader only

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
	spare         chan struct{} // hands the reading to a spare goroutine (read)

	current        atomic.Pointer[delivery] // the one the reader is handling
	parked         parkedList               // those waiting between attempts, oldest first
	prefetchWarned bool                     // watchAges's: the prefetch warning was given

	inFlight atomic.Int64
	waiting  atomic.Int64 // deliveries whose handler waits for a slot of the pool
	running  atomic.Int64 // deliveries in running calls: 1 each, or a batch's
	slots    holder       // the pool's slots its calls hold (pool.go)
	// firstAdmit, lastAdmit: monotimes of its first and latest delivery
	// taken in, kept only until the listener knows its queue serves
	// several channels at once (seeSideBySide).
	firstAdmit, lastAdmit atomic.Int64
	busyNanos             atomic.Int64 // handler time of finished calls
	handlerNanos          atomic.Int64 // a running mean of the handler time of its calls (leave)
	inlineWatch           *inlineWatch // for a handler the reader runs itself (gated)
	calls                 atomic.Uint64
	lastActive            atomic.Int64 // monotime of the last finished call

	sampledCalls uint64 // the scaler's previous look at calls
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
		careful: calm != nil, calm: calm, prefetch: prefetch,
		interrupt: make(chan struct{}),
		forget:    forget,
		finished:  make(chan struct{}),
		spare:     make(chan struct{}),
		ahead:     newReadAhead(),

		inlineWatch: newInlineWatch(),
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

	c.ended = ended
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
			cancel()
			l.pool.forgive(&c.slots)
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
			l.pool.forgive(&c.slots)
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
	sv.consumers.Add(1)
	go c.readAheadFrom(deliveries)
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

// keepsOrder reports whether the listener must handle the queue's messages
// in order: an ordered queue, or one delivery at a time asked for with one
// handler (WithPrefetch(1)). It then consumes on one channel and runs one
// handler.
func (l *Listener) keepsOrder() bool {
	return l.ordered() || (l.cfg.prefetchSet && l.cfg.prefetch == 1 && l.cfg.max == 1)
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

// interruptWaits closes the consumer's interrupt, once.
func (c *consumer) interruptWaits() {
	c.interruptOnce.Do(func() { close(c.interrupt) })
}

func (c *consumer) spawnReader() {
	if c.b != nil {
		c.spawnBatchReader(nil)
		return
	}
	c.sv.consumers.Add(1)
	go c.read()
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
	c.inlineWatch.timer.Stop()
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
